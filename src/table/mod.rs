//! The session table: which ids each session has in flight, the one decision
//! function over it, cancellation, the queue of waiting duplicates, and the
//! registration that releases a request's entries.
//!
//! # Why ids outlive some exchanges
//! An entry the server knows by the client's own id stays *abandoned* when
//! its exchange ends without its response, for `abandoned_id_ttl`: see the
//! crate docs, "Abandoned ids".
//!
//! # Cost per request
//! Every tracked request goes through [`Table::admit`] and, when its exchange
//! ends, [`Table::release`], so both are kept cheap and flat in the number of
//! sessions: the session id and each request id are hashed once, before the
//! lock is taken (the guard keeps the hashes for the release); each is looked
//! up once; a lone request, the usual case, allocates nothing when its
//! session already has requests in flight and its id is short; and a session
//! is one table slot holding its hash, so a lookup among thousands of
//! sessions compares hashes before it reads any id.
//!
//! # Memory
//! Everything the table holds is charged against one byte budget
//! (`max_table_bytes`, see [`budget`]): a request reserves an upper bound of
//! its cost before the lock is taken, so the table never holds more than the
//! budget plus what racing admissions settle above their bound (a few
//! bytes). When a request does not fit, the oldest abandoned ids of the whole
//! table are forgotten first (the table keeps their order across shards);
//! only when none is left is the request refused.
//!
//! # After a restart
//! See [`restart`] (why: `IdGuardLayer::restart_window`).

mod abandoned;
mod admit;
mod awaited;
mod budget;
pub(crate) mod config;
mod entries;
mod examined;
mod inline;
mod queue;
mod registration;
mod restart;
mod session;
mod stats;
mod tag;
#[cfg(any(test, feature = "internals"))]
mod track;

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use hashbrown::HashTable;

use crate::throttle::Throttle;
use crate::wire::id::{id_key_text, IdMinter};
use config::Config;
pub use config::OnDuplicate;

pub(crate) use inline::{unzip, InlineVec};
pub(crate) use queue::Waiter;
pub(crate) use registration::Registration;
pub use stats::Stats;
pub(crate) use tag::SessionTag;

use awaited::Awaited;
use budget::Eviction;
use entries::{Entry, ServerId};
use inline::SessionId;
use queue::WaitState;
use registration::Member;
use session::{KeyState, Probe, Session};

/// Independent locks, so that sessions on different shards never wait for
/// each other. A power of two keeps the shard pick a mask.
const SHARDS: usize = 64;

/// At most this many abandoned ids are kept (per layer), a second bound
/// besides the byte budget (it keeps the count, and so the work of expiring
/// them, independent of the budget); past it, the oldest are forgotten first
/// (and logged).
const MAX_ABANDONED: usize = 65_536;

/// A session left empty is kept for reuse by the shard's next new session if
/// its key table holds at most this many keys (a bound on what a shard keeps).
const SPARE_KEYS: usize = 16;

/// One lock's worth of sessions, on cache lines of its own: requests on
/// different shards, on different cores, then never contend for a line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<ShardState>);

#[derive(Debug, Default)]
struct ShardState {
    /// Sessions with requests in flight or abandoned ids, by the hash of the
    /// raw session id.
    sessions: HashTable<Session>,
    /// Abandoned ids in the order they were abandoned, which is also the
    /// order they expire in (one TTL per layer).
    abandoned: VecDeque<Abandoned>,
    /// Source of the serials of this shard's sessions and entries.
    next_serial: u64,
    /// The last session that ended, empty, for the shard's next new session:
    /// a session whose requests come one at a time starts and ends with each
    /// of them, and reusing its id buffer and key table spares allocating
    /// both every time.
    spare: Option<Session>,
    // The counters every request updates, summed over the shards by
    // `Table::stats`. Under the lock the request holds anyway they cost
    // nothing, where shared atomics would bounce one cache line between all
    // the cores serving requests.
    in_flight: usize,
    tracked_sessions: usize,
    passed_total: u64,
    remapped_total: u64,
    restart_remapped_total: u64,
    /// During the restart window: the hashes of the sessions of this shard
    /// whose start the guard saw.
    started: HashTable<u64>,
}

impl ShardState {
    /// A serial unique within the shard: it names a session or an entry for
    /// as long as it exists, without keeping (or comparing) a copy of its id.
    fn serial(serials: &mut u64) -> u64 {
        let serial = *serials;
        *serials += 1;
        serial
    }

    /// A new, empty session, made of the spare one if there is one.
    fn new_session(
        spare: &mut Option<Session>,
        serials: &mut u64,
        hash: u64,
        id: &[u8],
    ) -> Session {
        let serial = Self::serial(serials);
        match spare.take() {
            Some(mut session) => {
                session.hash = hash;
                session.serial = serial;
                session.id = SessionId::new(id);
                session
            }
            None => Session {
                hash,
                serial,
                id: SessionId::new(id),
                keys: HashTable::new(),
                in_flight: 0,
                resumptions: None,
            },
        }
    }

    /// Keeps a session that was just removed, empty, as the spare (without
    /// its id: a long one would be memory outside the budget), and returns
    /// the bytes its removal frees.
    fn keep_spare(spare: &mut Option<Session>, mut session: Session) -> isize {
        let mut freed = session::session_cost(session.id.as_bytes().len()) as isize;
        if session.resumptions.take().is_some() {
            freed += session::resumptions_cost() as isize;
        }
        if session.keys.capacity() <= SPARE_KEYS {
            session.id = SessionId::new(b"");
            *spare = Some(session);
        }
        -freed
    }
}

/// Where a session sits in its shard: the hash of its id and its serial.
#[derive(Debug, Clone, Copy)]
struct SessionRef {
    hash: u64,
    serial: u64,
}

/// A stream of a session, named by a keyed hash of the last event id its
/// client saw on it (the `Last-Event-ID` it would resume from). Keyed per
/// process, so a client cannot choose an id that names another stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamTag(std::num::NonZeroU64);

/// What a `GET` that resumes a stream needs of the table: the stream it
/// continues, and the byte budget that a link to where it goes on is
/// charged to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resumed {
    pub(crate) origin: StreamTag,
    pub(crate) max_table_bytes: usize,
}

impl Table {
    /// The tag of the stream whose last event id is `event_id`.
    pub(crate) fn stream_tag(&self, event_id: &[u8]) -> StreamTag {
        let hash = self.hasher.hash_one(event_id);
        StreamTag(std::num::NonZeroU64::new(hash).unwrap_or(std::num::NonZeroU64::MIN))
    }
}

/// Where an abandoned id sits, to drop it when it expires.
#[derive(Debug)]
pub(super) struct Abandoned {
    expires: Instant,
    session: SessionRef,
    key_hash: u64,
    serial: u64,
}

/// State shared by a layer and every service built from it.
#[derive(Debug)]
pub(crate) struct Table {
    shards: Box<[Shard]>,
    /// Hashes session ids and collision keys. Keyed per process (seeded by
    /// the OS), so that clients cannot choose ids that pile up in one bucket;
    /// one key for every table, so a session's hash is its tag in logs and
    /// traces ([`SessionTag`]).
    hasher: RandomState,
    minter: Arc<IdMinter>,
    abandoned: AtomicUsize,
    /// Bytes charged for what the table holds (see [`budget`]).
    used: AtomicUsize,
    /// Every shard's abandoned ids, oldest first, to forget them in that
    /// order under pressure. Taken only after a shard's lock, or alone.
    evictions: Mutex<VecDeque<Eviction>>,
    evicted_total: AtomicU64,
    /// The table's log lines, each at most once per interval with a count
    /// of the rest: a client decides how often each can happen.
    pub(crate) logs: Throttle<{ Log::ALL.len() }>,
    created: Instant,
    /// Where the table reads the time: given by the face that builds it, so
    /// the table needs no runtime (the tower layer gives tokio's clock, which
    /// a paused test runtime governs; see [`crate::core`]).
    clock: fn() -> Instant,
    /// The restart window has not been seen to end yet.
    restarting: AtomicBool,
    rejected_total: AtomicU64,
    queued_total: AtomicU64,
    cancelled_total: AtomicU64,
    restored_total: AtomicU64,
    /// Ids written like server-side ids that this table's minter did not
    /// issue for the response's session, passed on unrestored.
    refused_total: AtomicU64,
}

/// What the table and the admission log, one throttled line per kind.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Log {
    /// Abandoned ids forgotten before their time (the table was full).
    Evicted,
    /// A server-side id this guard did not issue for the session.
    RestoreRefused,
    /// A request whose id was already in flight (the normal case with
    /// clients that send every call as `id: 1`: not a warning).
    Duplicate,
    /// A session at its in-flight limit.
    OverCapacity,
    /// The table at its byte budget.
    OverBudget,
    /// A session id over the limit.
    SessionIdTooLong,
}

impl Log {
    pub(crate) const ALL: [Log; 6] = [
        Log::Evicted,
        Log::RestoreRefused,
        Log::Duplicate,
        Log::OverCapacity,
        Log::OverBudget,
        Log::SessionIdTooLong,
    ];

    /// `Some(lines not written since the last one)` when a line of this kind
    /// may be written now.
    pub(crate) fn due(self, table: &Table) -> Option<u64> {
        table.logs.ready(self as usize)
    }
}

/// How one admitted request goes to the inner service.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// With the client's own id.
    AsIs,
    /// With `server_id` (JSON text) instead; `duplicate` tells a collision
    /// from an abandoned id, a client id in the reserved namespace or
    /// `rewrite_all_ids`.
    Remapped {
        server_id: Arc<[u8]>,
        duplicate: bool,
    },
}

/// What the decision function says about one POST's requests.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Forward, request `i` as `routes[i]` says.
    Admitted {
        registration: Registration,
        routes: InlineVec<Route>,
    },
    /// Policy `Queue`: wait for the ticket, then forward as it says. The
    /// registration already counts the request.
    Queued {
        registration: Registration,
        ticket: Arc<Waiter>,
    },
    /// A collision the policy refuses (`Reject`, or a batch under `Queue`);
    /// `colliding[i]` says which. Nothing was registered.
    Duplicate { colliding: Vec<bool> },
    /// The session is at its in-flight cap. Nothing was registered.
    OverCapacity,
    /// The table's byte budget has no room for the requests, even after
    /// forgetting every abandoned id. Nothing was registered.
    OverBudget,
    /// The session id is longer than `max_session_id_bytes`. Nothing was
    /// registered.
    SessionIdTooLong,
}

/// The shard of a session. The hash tables take a slot from a hash's lowest
/// bits and a tag from its highest seven; the shard comes from bits neither
/// uses, so that the sessions of one shard still spread over its table.
fn shard_index(session_hash: u64) -> usize {
    (session_hash >> 40) as usize & (SHARDS - 1)
}

impl Table {
    pub(crate) fn new() -> Self {
        Self::with_minter(IdMinter::new())
    }

    /// A table whose server-side ids `minter` issues (and restores).
    pub(crate) fn with_minter(minter: IdMinter) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: tag::hasher().clone(),
            minter: Arc::new(minter),
            abandoned: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
            evictions: Mutex::new(VecDeque::new()),
            evicted_total: AtomicU64::new(0),
            logs: Throttle::default(),
            created: Instant::now(),
            clock: Instant::now,
            restarting: AtomicBool::new(true),
            rejected_total: AtomicU64::new(0),
            queued_total: AtomicU64::new(0),
            cancelled_total: AtomicU64::new(0),
            restored_total: AtomicU64::new(0),
            refused_total: AtomicU64::new(0),
        }
    }

    /// The table, reading the time from `clock`.
    pub(crate) fn clocked(mut self, clock: fn() -> Instant) -> Self {
        self.clock = clock;
        self.created = clock();
        self
    }

    /// The time by the table's clock.
    pub(crate) fn now(&self) -> Instant {
        (self.clock)()
    }

    /// The minter of this table's server-side ids.
    pub(crate) fn minter(&self) -> &Arc<IdMinter> {
        &self.minter
    }

    /// A session id's tag for logs: session ids are bearer secrets and are
    /// never logged raw.
    pub(crate) fn session_tag(&self, session: &[u8]) -> SessionTag {
        SessionTag::of_hash(self.hasher.hash_one(session))
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, ShardState> {
        // Nothing panics while a shard is held, but a poisoned lock must not
        // turn into leaked entries: the data is still consistent.
        self.shards[index]
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn shard(&self, session_hash: u64) -> MutexGuard<'_, ShardState> {
        let mut shard = self.lock(shard_index(session_hash));
        self.expire_abandoned(&mut shard);
        shard
    }

    fn probe<'a>(&self, raw: &'a str) -> Probe<'a> {
        let key = id_key_text(raw);
        Probe {
            raw,
            hash: self.hasher.hash_one(key.as_bytes()),
            key,
            colliding: false,
            abandoned: false,
        }
    }

    /// A server-side id for a request of `session` with the client id `raw`.
    fn mint(&self, session: &[u8], raw: &str) -> Arc<[u8]> {
        Arc::from(&*self.minter.mint_in(session, raw))
    }

    /// The registration of an admitted POST, awaiting these responses.
    fn register(
        self: &Arc<Self>,
        session: SessionRef,
        members: InlineVec<Member>,
        queued: Option<(u64, Arc<Waiter>)>,
        awaited: Awaited,
        config: &Config,
    ) -> Registration {
        Registration {
            table: Arc::clone(self),
            session,
            members,
            queued,
            awaited,
            count: 0,
            sent: true,
            abandoned_id_ttl: config.abandoned_id_ttl,
            stream: None,
        }
    }

    /// Handles a `notifications/cancelled` naming `request_id` in `session`.
    ///
    /// The cancellation goes to the first of these that the server has and
    /// that no cancellation named yet:
    /// 1. the live request the server knows by the client's own id (at most
    ///    one at a time): exactly the request an unguarded server would have
    ///    cancelled;
    /// 2. else the oldest live remapped request with that id: the client
    ///    still waits for it, while an abandoned one has no client left;
    /// 3. only when no live request has the id, an abandoned request the
    ///    server knows by the client's own id (it may still be working on
    ///    it, and an unguarded server would have cancelled that one).
    ///
    /// The id is free for the client at once: as long as the server might
    /// still answer the cancelled request, a new request with the id goes
    /// with a server-side id.
    ///
    /// Returns `None` when nothing matches (the notification passes
    /// unchanged), else the JSON text of the id the server knows the target by,
    /// for `requestId`.
    pub(crate) fn cancel(&self, session: &[u8], request_id: &str) -> Option<Arc<[u8]>> {
        let session_hash = self.hasher.hash_one(session);
        let probe = self.probe(request_id);
        let mut locked = self.shard(session_hash);
        let shard = &mut *locked;
        let state = shard
            .sessions
            .find_mut(session_hash, |entry| entry.is(session_hash, session))?
            .keys
            .find_mut(probe.hash, |state| state.is(&probe))?;
        // A live request comes before an abandoned one: naming an ended
        // request while a live one has the id would leave the live one
        // running and the id taken (see the order above).
        let entries = &mut state.entries;
        let own = entries.own().filter(|&position| {
            let entry = entries.get(position);
            entry.at_server && !entry.cancelled
        });
        let position = own
            .filter(|&position| entries.get(position).is_live())
            .or_else(|| entries.oldest_live_at_server())
            .or_else(|| own.filter(|&position| entries.get(position).is_abandoned()))?;
        entries.mark_cancelled(position);
        let server_id = entries.get(position).server_id.text(state.key.as_bytes());
        let mut delta = 0;
        self.grant_waiters(&mut shard.next_serial, session, state, &mut delta);
        drop(locked);
        self.apply(delta);
        self.cancelled_total.fetch_add(1, Ordering::Relaxed);
        Some(server_id)
    }

    /// Hands the id to waiting requests, first come first served, while the
    /// client has no live request with it. Adds the change in bytes to
    /// `delta`.
    fn grant_waiters(
        &self,
        serials: &mut u64,
        session: &[u8],
        state: &mut KeyState,
        delta: &mut isize,
    ) {
        while let Some(waiter) = state.waiters.front() {
            // Waiters exist only under `Queue`, where any live request blocks.
            if state.blocks(true) {
                return;
            }
            let serial = ShardState::serial(serials);
            let remap = (waiter.always_remap || state.has_abandoned())
                .then(|| self.mint(session, &waiter.raw_id));
            let server_id = match &remap {
                Some(server_id) => ServerId::Minted(Arc::clone(server_id)),
                None => ServerId::own(&waiter.raw_id, state.key.as_bytes()),
            };
            let mut wait_state = waiter.lock();
            if let WaitState::Waiting(waker) = &mut *wait_state {
                if let Some(waker) = waker.take() {
                    waker.wake();
                }
            }
            *wait_state = WaitState::Granted { serial, remap };
            drop(wait_state);
            *delta += entries::entry_cost(&server_id) as isize;
            *delta -= budget::waiter(waiter.raw_id.len()) as isize;
            state.entries.push(Entry {
                serial,
                server_id,
                cancelled: false,
                ended: false,
                at_server: false,
                removed: false,
                stream: None,
            });
            state.waiters.pop_front();
        }
    }

    /// Counts ids restored in responses.
    pub(crate) fn note_restored(&self, count: usize) {
        self.restored_total
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    /// Counts server-side-looking ids in responses that this guard did not
    /// issue for the response's session (another session's, or forged), and
    /// logs it at most once per interval: an upstream that mixes sessions up
    /// is what the guard exists for, and must be seen.
    pub(crate) fn note_refused(&self, count: usize) {
        let total = self
            .refused_total
            .fetch_add(count as u64, Ordering::Relaxed)
            + count as u64;
        if let Some(suppressed) = Log::RestoreRefused.due(self) {
            tracing::warn!(
                refused_total = total,
                "a response carried a server-side id this guard did not issue for its session \
                 (another session's, or forged); passed on unrestored \
                 ({suppressed} more such responses since the last such line)"
            );
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut stats = Stats {
            abandoned_ids: self.abandoned.load(Ordering::Relaxed),
            rejected_total: self.rejected_total.load(Ordering::Relaxed),
            queued_total: self.queued_total.load(Ordering::Relaxed),
            cancelled_total: self.cancelled_total.load(Ordering::Relaxed),
            restored_total: self.restored_total.load(Ordering::Relaxed),
            restore_refused_total: self.refused_total.load(Ordering::Relaxed),
            abandoned_evicted_total: self.evicted_total.load(Ordering::Relaxed),
            ..Stats::default()
        };
        for index in 0..SHARDS {
            let shard = self.lock(index);
            stats.in_flight_requests += shard.in_flight;
            stats.in_flight_sessions += shard.tracked_sessions;
            stats.passed_total += shard.passed_total;
            stats.remapped_total += shard.remapped_total;
            stats.restart_remapped_total += shard.restart_remapped_total;
        }
        stats.table_bytes = self.used.load(Ordering::Relaxed);
        stats
    }
}

#[cfg(test)]
mod tests;
