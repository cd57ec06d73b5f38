//! The session table: which ids each session has in flight, the one decision
//! function over it, cancellation, the queue of waiting duplicates, and the
//! registration that releases a request's entries.
//!
//! # Why ids outlive some exchanges
//! The server may still answer a request after the client stopped caring:
//! after a disconnect (the spec says a disconnect is not a cancellation), or
//! after `notifications/cancelled` when the handler does not stop. If the
//! client's id were handed back as-is to the next request, that late answer
//! would be routed to it: one user's data to another. So an entry whose
//! server-visible id is the client's own stays *abandoned* while the server may
//! still answer it: from when its client stopped waiting (exchange ended
//! early, or cancelled) for `abandoned_id_ttl`. A new request with an
//! abandoned id is never refused: it goes with a server-side id, whatever the
//! policy.
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
//! A new table knows nothing of the requests the server may still be
//! running. For the restart window, it remembers the sessions whose start it
//! saw (hashes only) and sends every request of any other session with a
//! server-side id.

mod budget;
mod inline;
mod queue;
mod registration;
mod session;

use std::cell::OnceCell;
use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use hashbrown::hash_table::Entry as Slot;
use hashbrown::HashTable;

use crate::config::{Config, OnDuplicate};
use crate::id::{id_key_text, is_reserved, IdKey, IdMinter};
use crate::stats::Stats;

pub(crate) use inline::InlineVec;
pub(crate) use queue::Waiter;
pub(crate) use registration::Registration;

use budget::Eviction;
use inline::SessionId;
use queue::{remove_waiter, WaitState};
use registration::Member;
use session::{Entry, KeyState, Probe, ServerId, Session};

/// Independent locks, so that sessions on different shards never wait for
/// each other. A power of two keeps the shard pick a mask.
const SHARDS: usize = 64;

/// At most this many abandoned ids are kept (per layer), a second bound
/// besides the byte budget (it keeps the count, and so the work of expiring
/// them, independent of the budget); past it, the oldest are forgotten first
/// (and logged).
const MAX_ABANDONED: usize = 65_536;

/// Forgetting abandoned ids early is logged at most this often.
const EVICTION_LOG_INTERVAL_MS: u64 = 1_000;

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
            },
        }
    }

    /// Keeps a session that was just removed, empty, as the spare (without
    /// its id: a long one would be memory outside the budget), and returns
    /// the bytes its removal frees.
    fn keep_spare(spare: &mut Option<Session>, mut session: Session) -> isize {
        let freed = budget::session(session.id.as_bytes().len()) as isize;
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
    /// Hashes session ids and collision keys. Keyed per layer (seeded by the
    /// OS), so that clients cannot choose ids that pile up in one bucket.
    hasher: RandomState,
    minter: IdMinter,
    abandoned: AtomicUsize,
    /// Bytes charged for what the table holds (see [`budget`]).
    used: AtomicUsize,
    /// Every shard's abandoned ids, oldest first, to forget them in that
    /// order under pressure. Taken only after a shard's lock, or alone.
    evictions: Mutex<VecDeque<Eviction>>,
    evicted_total: AtomicU64,
    /// When forgetting ids was last logged, in milliseconds since `created`.
    eviction_logged_at: AtomicU64,
    created: Instant,
    /// The restart window has not been seen to end yet.
    restarting: AtomicBool,
    rejected_total: AtomicU64,
    queued_total: AtomicU64,
    cancelled_total: AtomicU64,
    restored_total: AtomicU64,
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
pub(crate) enum Admission {
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

/// A short, non-reversible tag of a session id's hash for logs.
fn tag(session_hash: u64) -> String {
    format!("{:08x}", session_hash >> 32)
}

/// The shard of a session. The hash tables take a slot from a hash's lowest
/// bits and a tag from its highest seven; the shard comes from bits neither
/// uses, so that the sessions of one shard still spread over its table.
fn shard_index(session_hash: u64) -> usize {
    (session_hash >> 40) as usize & (SHARDS - 1)
}

impl Table {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: RandomState::new(),
            minter: IdMinter::new(),
            abandoned: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
            evictions: Mutex::new(VecDeque::new()),
            evicted_total: AtomicU64::new(0),
            eviction_logged_at: AtomicU64::new(0),
            created: Instant::now(),
            restarting: AtomicBool::new(true),
            rejected_total: AtomicU64::new(0),
            queued_total: AtomicU64::new(0),
            cancelled_total: AtomicU64::new(0),
            restored_total: AtomicU64::new(0),
        }
    }

    /// A short, non-reversible tag of a session id for logs: session ids are
    /// bearer secrets and are never logged raw.
    pub(crate) fn session_tag(&self, session: &[u8]) -> String {
        tag(self.hasher.hash_one(session))
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

    fn mint(&self, raw: &str) -> Arc<[u8]> {
        Arc::from(self.minter.mint(raw))
    }

    /// The decision function: checks the ids of one POST's requests (in body
    /// order) against the session's in-flight ids and registers them, all under
    /// one lock with no await point, so two racing POSTs cannot both pass.
    pub(crate) fn admit(
        self: &Arc<Self>,
        session: &[u8],
        ids: &[&str],
        is_batch: bool,
        config: &Config,
    ) -> Admission {
        if session.len() > config.max_session_id_bytes {
            self.rejected_total
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            return Admission::SessionIdTooLong;
        }
        let session_hash = self.hasher.hash_one(session);
        // A lone request, the usual case, needs no vector.
        let mut single: [Probe<'_>; 1];
        let mut many: Vec<Probe<'_>>;
        let probes: &mut [Probe<'_>] = if let [raw] = ids {
            single = [self.probe(raw)];
            &mut single
        } else {
            many = ids.iter().map(|raw| self.probe(raw)).collect();
            &mut many
        };

        // Room for the most the requests can cost, reserved before the lock
        // is taken (making room may take other shards' locks); what they
        // really cost is settled once they are in.
        let bound = budget::session(session.len())
            + probes
                .iter()
                .map(|probe| {
                    budget::key(probe.key.len())
                        + budget::entry_bound(probe.raw.len()).max(budget::waiter(probe.raw.len()))
                })
                .sum::<usize>();
        if !self.make_room(bound, config.max_table_bytes) {
            self.rejected_total
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            return Admission::OverBudget;
        }
        let mut charged = 0;
        let restarting = self.restart_window_open(config);

        let mut locked = self.shard(session_hash);
        let shard = &mut *locked;
        let slot = shard.sessions.entry(
            session_hash,
            |entry| entry.is(session_hash, session),
            |entry| entry.hash,
        );
        let existing = match &slot {
            Slot::Occupied(occupied) => Some(occupied.get()),
            Slot::Vacant(_) => None,
        };
        let current = existing.map_or(0, |entry| entry.in_flight);
        if current + ids.len() > config.max_in_flight_per_session {
            drop(locked);
            self.settle(bound, 0);
            self.rejected_total
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            return Admission::OverCapacity;
        }

        // A request collides with a live request of the session with the same
        // id (see `KeyState::is_taken`), and with an earlier request of the
        // same batch. Every decision is taken against the state before this
        // POST, so all of them come first.
        let any_live_collides = config.on_duplicate != OnDuplicate::Remap || config.rewrite_all_ids;
        for index in 0..probes.len() {
            let (earlier, rest) = probes.split_at_mut(index);
            let probe = &rest[0];
            let state =
                existing.and_then(|entry| entry.keys.find(probe.hash, |state| state.is(probe)));
            let colliding = state.is_some_and(|state| state.is_taken(any_live_collides))
                || earlier.iter().any(|other| other.same_key(probe));
            let abandoned = state.is_some_and(KeyState::has_abandoned);
            rest[0].colliding = colliding;
            rest[0].abandoned = abandoned;
        }
        let any_collision = probes.iter().any(|probe| probe.colliding);
        // Only a lone request waits; holding a whole batch for one member
        // would delay its other requests behind unrelated work.
        let queue_single = config.on_duplicate == OnDuplicate::Queue && !is_batch;
        let refuse = match config.on_duplicate {
            OnDuplicate::Remap => false,
            OnDuplicate::Queue => !queue_single,
            OnDuplicate::Reject => true,
        };
        if any_collision && refuse {
            drop(locked);
            self.settle(bound, 0);
            self.rejected_total
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            let colliding = probes.iter().map(|probe| probe.colliding).collect();
            return Admission::Duplicate { colliding };
        }

        // A session that started before this table existed (or without it
        // seeing the start) may have requests at the server that the table
        // knows nothing of: during the restart window, every id of such a
        // session counts as abandoned.
        let unseen = restarting
            && shard
                .started
                .find(session_hash, |started| *started == session_hash)
                .is_none();
        let entry = match slot {
            Slot::Occupied(occupied) => occupied.into_mut(),
            Slot::Vacant(vacant) => {
                charged += budget::session(session.len());
                let entry = ShardState::new_session(
                    &mut shard.spare,
                    &mut shard.next_serial,
                    session_hash,
                    session,
                );
                vacant.insert(entry).into_mut()
            }
        };
        if entry.in_flight == 0 {
            shard.tracked_sessions += 1;
        }
        entry.in_flight += ids.len();
        shard.in_flight += ids.len();
        let at = SessionRef {
            hash: session_hash,
            serial: entry.serial,
        };

        if any_collision && queue_single {
            let probe = &probes[0];
            let ticket = Arc::new(Waiter {
                raw_id: probe.raw.into(),
                always_remap: config.rewrite_all_ids || is_reserved(&probe.key) || unseen,
                state: Mutex::new(WaitState::Waiting(None)),
            });
            charged += budget::waiter(probe.raw.len());
            KeyState::get_or_insert(&mut entry.keys, probe, &mut charged)
                .waiters
                .push_back(Arc::clone(&ticket));
            drop(locked);
            self.settle(bound, charged);
            self.queued_total.fetch_add(1, Ordering::Relaxed);
            let queued = Some((probe.hash, Arc::clone(&ticket)));
            return Admission::Queued {
                registration: self.register(at, InlineVec::default(), queued, probes, config),
                ticket,
            };
        }

        let mut members = InlineVec::with_capacity(probes.len());
        let mut routes = InlineVec::with_capacity(probes.len());
        for probe in probes.iter() {
            let serial = ShardState::serial(&mut shard.next_serial);
            let duplicate = probe.colliding;
            let remap_anyway =
                duplicate || probe.abandoned || is_reserved(&probe.key) || config.rewrite_all_ids;
            let remap = remap_anyway || unseen;
            let state = KeyState::get_or_insert(&mut entry.keys, probe, &mut charged);
            let server_id = if remap {
                shard.remapped_total += 1;
                if !remap_anyway {
                    shard.restart_remapped_total += 1;
                }
                let server_id = self.mint(probe.raw);
                routes.push(Route::Remapped {
                    server_id: Arc::clone(&server_id),
                    duplicate,
                });
                ServerId::Minted(server_id)
            } else {
                shard.passed_total += 1;
                routes.push(Route::AsIs);
                ServerId::own(probe.raw, state.key.as_bytes())
            };
            charged += budget::entry(&server_id);
            state.entries.push(Entry {
                serial,
                server_id,
                cancelled: false,
                ended: false,
                at_server: true,
            });
            members.push(Member {
                key_hash: probe.hash,
                serial,
            });
        }
        drop(locked);
        self.settle(bound, charged);

        Admission::Admitted {
            registration: self.register(at, members, None, probes, config),
            routes,
        }
    }

    /// The registration of an admitted POST.
    fn register(
        self: &Arc<Self>,
        session: SessionRef,
        members: InlineVec<Member>,
        queued: Option<(u64, Arc<Waiter>)>,
        probes: &[Probe<'_>],
        config: &Config,
    ) -> Registration {
        // Policies that turn a collision into a visible refusal or a wait free
        // the ids as soon as their responses have passed.
        let awaited = if config.on_duplicate == OnDuplicate::Remap {
            Vec::new()
        } else {
            probes
                .iter()
                .map(|probe| IdKey::from(&*probe.key))
                .collect()
        };
        Registration {
            table: Arc::clone(self),
            session,
            members,
            queued,
            awaited,
            count: probes.len(),
            completed: false,
            abandoned_id_ttl: config.abandoned_id_ttl,
        }
    }

    /// Handles a `notifications/cancelled` naming `request_id` in `session`.
    ///
    /// The cancellation goes to the request of the session the server knows
    /// by the client's own id (at most one is live at a time; an abandoned one
    /// counts too, the server may still be working on it): exactly the request
    /// an unguarded server would have cancelled, and usually the oldest. Only
    /// when there is none does it go to the oldest remapped request with that
    /// id. Requests already cancelled are skipped. The id is free for the
    /// client at once: as long as the server might still answer the cancelled
    /// request, a new request with the id goes with a server-side id.
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
        // The request the server knows by the client's own id, if any; else
        // the oldest remapped one.
        let position = state
            .entries
            .iter()
            .position(|entry| entry.at_server && !entry.cancelled && !entry.remapped())
            .or_else(|| {
                state
                    .entries
                    .iter()
                    .position(|entry| entry.at_server && !entry.cancelled)
            })?;
        let target = state.entries.get_mut(position)?;
        target.cancelled = true;
        let server_id = target.server_id.text(state.key.as_bytes());
        let mut delta = 0;
        self.grant_waiters(&mut shard.next_serial, state, &mut delta);
        drop(locked);
        self.apply(delta);
        self.cancelled_total.fetch_add(1, Ordering::Relaxed);
        Some(server_id)
    }

    /// Hands the id to waiting requests, first come first served, while the
    /// client has no live request with it. Adds the change in bytes to
    /// `delta`.
    fn grant_waiters(&self, serials: &mut u64, state: &mut KeyState, delta: &mut isize) {
        while let Some(waiter) = state.waiters.front() {
            // Waiters exist only under `Queue`, where any live request blocks.
            if state.blocks(true) {
                return;
            }
            let serial = ShardState::serial(serials);
            let remap =
                (waiter.always_remap || state.has_abandoned()).then(|| self.mint(&waiter.raw_id));
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
            *delta += budget::entry(&server_id) as isize;
            *delta -= budget::waiter(waiter.raw_id.len()) as isize;
            state.entries.push(Entry {
                serial,
                server_id,
                cancelled: false,
                ended: false,
                at_server: false,
            });
            state.waiters.pop_front();
        }
    }

    fn release(&self, registration: &Registration) {
        let index = shard_index(registration.session.hash);
        let mut locked = self.shard(registration.session.hash);
        let shard = &mut *locked;
        shard.in_flight = shard.in_flight.saturating_sub(registration.count);
        let Ok(mut slot) = shard
            .sessions
            .find_entry(registration.session.hash, |entry| {
                entry.serial == registration.session.serial
            })
        else {
            return;
        };
        let session = slot.get_mut();
        let mut delta = 0;
        // An exchange that did not end normally may still be answered by the
        // server; keep its ids abandoned for a while. So may a cancelled one,
        // even when the server closed its stream: a handler that ignores the
        // cancellation still answers, under the client's id. The clock is read
        // only if an id is kept, and then once.
        let keep_until = OnceCell::new();
        let keep_until = || {
            *keep_until.get_or_init(|| {
                (!registration.abandoned_id_ttl.is_zero())
                    .then(|| Instant::now().checked_add(registration.abandoned_id_ttl))
                    .flatten()
            })
        };
        let queued = registration.queued.as_ref().and_then(|(key_hash, ticket)| {
            let granted = match &*ticket.lock() {
                WaitState::Granted { serial, .. } => Some(*serial),
                WaitState::Waiting(_) => None,
            };
            match granted {
                Some(serial) => Some(Member {
                    key_hash: *key_hash,
                    serial,
                }),
                None => {
                    delta -= remove_waiter(session, *key_hash, ticket) as isize;
                    None
                }
            }
        });
        let mut kept_any = false;
        for member in registration.members.iter().copied().chain(queued) {
            let kept = self.end_entry(
                &mut shard.next_serial,
                session,
                member,
                registration.completed,
                keep_until,
                &mut delta,
            );
            if let Some(expires) = kept {
                kept_any = true;
                shard.abandoned.push_back(Abandoned {
                    expires,
                    session: registration.session,
                    key_hash: member.key_hash,
                    serial: member.serial,
                });
                self.push_eviction(Eviction {
                    expires,
                    shard: index,
                });
            }
        }
        session.in_flight = session.in_flight.saturating_sub(registration.count);
        let idle = session.in_flight == 0;
        if session.is_empty() {
            delta += ShardState::keep_spare(&mut shard.spare, slot.remove().0);
        }
        if idle {
            shard.tracked_sessions = shard.tracked_sessions.saturating_sub(1);
        }
        drop(locked);
        self.apply(delta);
        if kept_any {
            // The second bound: beyond it, the oldest abandoned ids go.
            while self.abandoned.load(Ordering::Relaxed) > MAX_ABANDONED && self.evict_oldest() {}
        }
    }

    /// Ends a forwarded request's entry: removes it, or, when the server
    /// knows it by the client's own id and may still answer it (the exchange
    /// did not complete, or it was cancelled), keeps it as abandoned until
    /// `keep_until()` (returned). Passes the id on to the next waiter. Adds
    /// the change in bytes to `delta`.
    fn end_entry(
        &self,
        serials: &mut u64,
        session: &mut Session,
        member: Member,
        completed: bool,
        keep_until: impl Fn() -> Option<Instant>,
        delta: &mut isize,
    ) -> Option<Instant> {
        let Member { key_hash, serial } = member;
        let Ok(mut slot) = session
            .keys
            .find_entry(key_hash, |state| state.holds(key_hash, serial))
        else {
            return None;
        };
        let state = slot.get_mut();
        let mut kept = None;
        let position = state
            .entries
            .iter()
            .position(|entry| entry.serial == serial);
        if let Some(position) = position {
            let entry = state.entries.get_mut(position)?;
            let may_still_answer = !entry.remapped() && (!completed || entry.cancelled);
            match may_still_answer.then(&keep_until).flatten() {
                Some(expires) => {
                    entry.ended = true;
                    self.abandoned.fetch_add(1, Ordering::Relaxed);
                    *delta += budget::ABANDONED as isize;
                    kept = Some(expires);
                }
                None => {
                    *delta -= budget::entry(&entry.server_id) as isize;
                    state.entries.remove(position);
                }
            }
            self.grant_waiters(serials, state, delta);
        }
        if state.is_empty() {
            *delta -= state.cost() as isize;
            slot.remove();
        }
        kept
    }

    /// Drops abandoned ids whose time is up, and sessions left empty.
    /// Amortised O(1): expiries are in order. Reads the clock only when the
    /// shard has abandoned ids at all.
    fn expire_abandoned(&self, shard: &mut ShardState) {
        if shard.abandoned.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut delta = 0;
        while shard
            .abandoned
            .front()
            .is_some_and(|first| first.expires <= now)
        {
            let Some(expired) = shard.abandoned.pop_front() else {
                break;
            };
            self.drop_abandoned(shard, &expired, &mut delta);
        }
        self.apply(delta);
    }

    /// Drops one abandoned id, whose record was just taken off the shard's
    /// queue, and its key and session if they are left empty. Adds the bytes
    /// freed to `delta`.
    fn drop_abandoned(&self, shard: &mut ShardState, record: &Abandoned, delta: &mut isize) {
        *delta -= budget::ABANDONED as isize;
        let Ok(mut slot) = shard.sessions.find_entry(record.session.hash, |entry| {
            entry.serial == record.session.serial
        }) else {
            return;
        };
        let session = slot.get_mut();
        let key_hash = record.key_hash;
        let found = session
            .keys
            .find_entry(key_hash, |state| state.holds(key_hash, record.serial));
        if let Ok(mut key_slot) = found {
            let state = key_slot.get_mut();
            let position = state
                .entries
                .iter()
                .position(|entry| entry.serial == record.serial && entry.ended);
            if let Some(position) = position {
                if let Some(entry) = state.entries.get_mut(position) {
                    *delta -= budget::entry(&entry.server_id) as isize;
                }
                state.entries.remove(position);
                self.abandoned.fetch_sub(1, Ordering::Relaxed);
                self.grant_waiters(&mut shard.next_serial, state, delta);
            }
            if state.is_empty() {
                *delta -= state.cost() as isize;
                key_slot.remove();
            }
        }
        if session.is_empty() {
            *delta += ShardState::keep_spare(&mut shard.spare, slot.remove().0);
        }
    }

    /// Records an abandoned id in the table-wide eviction order (called with
    /// its shard's lock held, so a shard's records and its evictions are in
    /// the same order), dropping records whose time is up.
    fn push_eviction(&self, eviction: Eviction) {
        let mut order = self
            .evictions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        while order.front().is_some_and(|first| first.expires <= now) {
            order.pop_front();
        }
        order.push_back(eviction);
    }

    /// Forgets the oldest abandoned id of the table, before its time. Returns
    /// `false` when there is none left. Takes no lock while holding another.
    fn evict_oldest(&self) -> bool {
        loop {
            let victim = {
                let mut order = self
                    .evictions
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let now = Instant::now();
                loop {
                    match order.pop_front() {
                        None => return false,
                        // Expired: its shard drops it on its next use.
                        Some(eviction) if eviction.expires <= now => {}
                        Some(eviction) => break eviction,
                    }
                }
            };
            let mut shard = self.lock(victim.shard);
            self.expire_abandoned(&mut shard);
            // The shard's oldest record is the victim's (or, if that one
            // expired meanwhile, the next: as good a choice).
            let Some(record) = shard.abandoned.pop_front() else {
                continue;
            };
            let mut delta = 0;
            self.drop_abandoned(&mut shard, &record, &mut delta);
            drop(shard);
            self.apply(delta);
            let evicted = self.evicted_total.fetch_add(1, Ordering::Relaxed) + 1;
            self.log_eviction(evicted);
            return true;
        }
    }

    fn log_eviction(&self, evicted: u64) {
        let now = u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.eviction_logged_at.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= EVICTION_LOG_INTERVAL_MS;
        if due
            && self
                .eviction_logged_at
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                evicted_total = evicted,
                table_bytes = self.used.load(Ordering::Relaxed),
                "table full: forgetting the oldest abandoned ids before their time"
            );
        }
    }

    /// Reserves `bytes` of the budget `limit`, forgetting the oldest
    /// abandoned ids as long as that is needed and possible.
    fn make_room(&self, bytes: usize, limit: usize) -> bool {
        loop {
            if self.reserve(bytes, limit) {
                return true;
            }
            if !self.evict_oldest() {
                return false;
            }
        }
    }

    fn reserve(&self, bytes: usize, limit: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(bytes).filter(|next| *next <= limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    /// Replaces a reservation of `reserved` bytes by the `charged` ones.
    fn settle(&self, reserved: usize, charged: usize) {
        self.apply(charged as isize - reserved as isize);
    }

    fn apply(&self, delta: isize) {
        if delta > 0 {
            self.used.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
        } else if delta < 0 {
            self.used.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// Whether the restart window is still open; the first call after it
    /// ended frees the sessions seen starting.
    fn restart_window_open(&self, config: &Config) -> bool {
        if !self.restarting.load(Ordering::SeqCst) {
            return false;
        }
        if self.created.elapsed() < config.restart_window() {
            return true;
        }
        if self.restarting.swap(false, Ordering::SeqCst) {
            for index in 0..SHARDS {
                let started = std::mem::take(&mut self.lock(index).started);
                self.apply(-((started.len() * budget::STARTED) as isize));
            }
        }
        false
    }

    /// Whether the guard should watch for sessions starting: the restart
    /// window is open.
    pub(crate) fn watches_starts(&self, config: &Config) -> bool {
        self.restart_window_open(config)
    }

    /// Records that the server started `session` (the `Mcp-Session-Id` of an
    /// answer to `initialize`): during the restart window its requests need
    /// no server-side ids. Not recorded when the id is too long, the window
    /// has ended, or the budget has no room (the session's requests are then
    /// remapped for the window, which is always safe).
    pub(crate) fn note_started(&self, session: &[u8], config: &Config) {
        if session.len() > config.max_session_id_bytes || !self.restart_window_open(config) {
            return;
        }
        if !self.reserve(budget::STARTED, config.max_table_bytes) {
            tracing::debug!("table full: a session start is not recorded");
            return;
        }
        let hash = self.hasher.hash_one(session);
        let mut shard = self.shard(hash);
        // Checked under the lock: the window's end clears each shard after
        // it is marked closed, so nothing is added behind it.
        let open = self.restarting.load(Ordering::SeqCst);
        let inserted = open
            && matches!(
                shard
                    .started
                    .entry(hash, |seen| *seen == hash, |seen| *seen),
                Slot::Vacant(_)
            );
        if inserted {
            shard.started.insert_unique(hash, hash, |seen| *seen);
        }
        drop(shard);
        if !inserted {
            self.apply(-(budget::STARTED as isize));
        }
    }

    /// Records that a queued request whose turn came has been handed to the
    /// inner service.
    fn mark_forwarded(&self, registration: &Registration) {
        let Some((key_hash, ticket)) = &registration.queued else {
            return;
        };
        let WaitState::Granted { serial, .. } = *ticket.lock() else {
            return;
        };
        let mut shard = self.shard(registration.session.hash);
        let entry = Session::find(&mut shard.sessions, registration.session)
            .and_then(|session| {
                session
                    .keys
                    .find_mut(*key_hash, |state| state.holds(*key_hash, serial))
            })
            .and_then(|state| {
                state
                    .entries
                    .iter_mut()
                    .find(|entry| entry.serial == serial)
            });
        if let Some(entry) = entry {
            entry.at_server = true;
        }
    }

    /// Counts ids restored in responses.
    pub(crate) fn note_restored(&self, count: usize) {
        self.restored_total
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut stats = Stats {
            abandoned_ids: self.abandoned.load(Ordering::Relaxed),
            rejected_total: self.rejected_total.load(Ordering::Relaxed),
            queued_total: self.queued_total.load(Ordering::Relaxed),
            cancelled_total: self.cancelled_total.load(Ordering::Relaxed),
            restored_total: self.restored_total.load(Ordering::Relaxed),
            abandoned_evicted_total: self.evicted_total.load(Ordering::Relaxed),
            ..Stats::default()
        };
        for index in 0..SHARDS {
            let shard = self.lock(index);
            stats.in_flight_requests += shard.in_flight;
            stats.tracked_sessions += shard.tracked_sessions;
            stats.passed_total += shard.passed_total;
            stats.remapped_total += shard.remapped_total;
            stats.restart_remapped_total += shard.restart_remapped_total;
        }
        stats.table_bytes = self.used.load(Ordering::Relaxed);
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    /// The settings of most tests: no restart window (their sessions never
    /// start through the table).
    fn config(on_duplicate: OnDuplicate) -> Config {
        Config {
            on_duplicate,
            max_in_flight_per_session: 8,
            restart_window: Some(Duration::ZERO),
            ..Config::default()
        }
    }

    fn admit(table: &Arc<Table>, ids: &[&str], policy: OnDuplicate) -> Admission {
        table.admit(b"session-a", ids, ids.len() > 1, &config(policy))
    }

    fn assert_drained(table: &Table) {
        let stats = table.stats();
        assert_eq!((stats.in_flight_requests, stats.tracked_sessions), (0, 0));
    }

    /// Ends a registration as a finished exchange (dropping it abandons it).
    fn end(admission: Admission) {
        match admission {
            Admission::Admitted { registration, .. } | Admission::Queued { registration, .. } => {
                registration.complete()
            }
            Admission::Duplicate { .. }
            | Admission::OverCapacity
            | Admission::OverBudget
            | Admission::SessionIdTooLong => {}
        }
    }

    #[test]
    fn remap_then_release_frees_everything() {
        let table = Arc::new(Table::new());
        let first = admit(&table, &["1"], OnDuplicate::Remap);
        let second = admit(&table, &["\"1\""], OnDuplicate::Remap);
        let Admission::Admitted { routes, .. } = &second else {
            panic!("admitted expected")
        };
        assert!(
            matches!(
                routes[0],
                Route::Remapped {
                    duplicate: true,
                    ..
                }
            ),
            "the string \"1\" collides with 1"
        );
        assert_eq!(table.stats().in_flight_requests, 2);
        assert_eq!(table.stats().tracked_sessions, 1);
        end(first);
        let third = admit(&table, &["1"], OnDuplicate::Remap);
        let Admission::Admitted { routes, .. } = &third else {
            panic!("admitted expected")
        };
        assert_eq!(routes[0], Route::AsIs, "the unchanged slot is free again");
        end(second);
        end(third);
        assert_drained(&table);
    }

    #[test]
    fn under_reject_a_request_remapped_past_a_shadow_still_holds_its_id() {
        let table = Arc::new(Table::new());
        drop(admit(&table, &["1"], OnDuplicate::Reject)); // abandoned: shadows 1
        let second = admit(&table, &["1"], OnDuplicate::Reject);
        assert!(matches!(
            &second,
            Admission::Admitted { routes, .. } if matches!(routes[0], Route::Remapped { duplicate: false, .. })
        ));
        assert!(
            matches!(
                admit(&table, &["1"], OnDuplicate::Reject),
                Admission::Duplicate { .. }
            ),
            "the client already has a request 1 in flight"
        );
        assert!(
            matches!(
                admit(&table, &["1"], OnDuplicate::Queue),
                Admission::Queued { .. }
            ),
            "and under Queue it waits for it"
        );
        end(second);
    }

    #[test]
    fn reject_registers_nothing_and_flags_batch_members() {
        let table = Arc::new(Table::new());
        let _held = admit(&table, &["1"], OnDuplicate::Reject);
        let Admission::Duplicate { colliding } =
            admit(&table, &["2", "1", "2"], OnDuplicate::Reject)
        else {
            panic!("duplicate expected")
        };
        assert_eq!(colliding, [false, true, true]);
        assert_eq!(table.stats().in_flight_requests, 1);
    }

    #[test]
    fn reserved_ids_are_always_rewritten() {
        let table = Arc::new(Table::new());
        let Admission::Admitted { routes, .. } =
            admit(&table, &["\"mcp-id-guard:forged\""], OnDuplicate::Reject)
        else {
            panic!("admitted expected")
        };
        assert!(matches!(
            routes[0],
            Route::Remapped {
                duplicate: false,
                ..
            }
        ));
    }

    #[test]
    fn capacity_counts_requests() {
        let table = Arc::new(Table::new());
        let _held = admit(&table, &["1", "2", "3", "4", "5", "6"], OnDuplicate::Remap);
        assert!(matches!(
            admit(&table, &["7", "8", "9"], OnDuplicate::Remap),
            Admission::OverCapacity
        ));
        assert!(matches!(
            admit(&table, &["7", "8"], OnDuplicate::Remap),
            Admission::Admitted { .. }
        ));
        assert!(matches!(
            table.admit(b"session-b", &["1"], false, &config(OnDuplicate::Remap)),
            Admission::Admitted { .. }
        ));
    }

    #[test]
    fn cancel_frees_the_oldest_and_names_its_server_id() {
        let table = Arc::new(Table::new());
        let first = admit(&table, &["1"], OnDuplicate::Remap);
        let second = admit(&table, &["1"], OnDuplicate::Remap);
        let Admission::Admitted { routes, .. } = &second else {
            panic!("admitted expected")
        };
        let Route::Remapped { server_id, .. } = &routes[0] else {
            panic!("remapped expected")
        };
        assert_eq!(
            table.cancel(b"session-b", "1"),
            None,
            "other sessions are untouched"
        );
        assert_eq!(
            table.cancel(b"session-a", "\"1\""),
            Some(Arc::from(&b"1"[..])),
            "the oldest, named as the server knows it"
        );
        assert_eq!(table.cancel(b"session-a", "1"), Some(Arc::clone(server_id)));
        assert_eq!(table.cancel(b"session-a", "1"), None);
        let reuse = admit(&table, &["1"], OnDuplicate::Reject);
        let Admission::Admitted { routes, .. } = &reuse else {
            panic!("freed at once")
        };
        assert!(
            matches!(
                routes[0],
                Route::Remapped {
                    duplicate: false,
                    ..
                }
            ),
            "the server may still answer the cancelled one"
        );
        assert_eq!(table.stats().cancelled_total, 2);
        end(first);
        end(second);
        end(reuse);
        assert_eq!(
            table.stats().abandoned_ids,
            1,
            "the cancelled request the server knew as 1 may still be answered"
        );
        assert_drained(&table);
    }

    #[test]
    fn queue_hands_the_id_over_in_order() {
        let table = Arc::new(Table::new());
        let first = admit(&table, &["1"], OnDuplicate::Queue);
        let Admission::Queued {
            registration: second,
            ticket: second_ticket,
        } = admit(&table, &["1"], OnDuplicate::Queue)
        else {
            panic!("queued expected")
        };
        let Admission::Queued {
            registration: third,
            ticket: third_ticket,
        } = admit(&table, &["1"], OnDuplicate::Queue)
        else {
            panic!("queued expected")
        };
        let mut cx = Context::from_waker(Waker::noop());
        assert!(second_ticket.poll_turn(&mut cx).is_pending());
        end(first);
        assert_eq!(second_ticket.poll_turn(&mut cx), Poll::Ready(None));
        assert!(third_ticket.poll_turn(&mut cx).is_pending());
        assert_eq!(table.stats().in_flight_requests, 2);
        second.complete();
        assert_eq!(third_ticket.poll_turn(&mut cx), Poll::Ready(None));
        third.complete();
        assert_drained(&table);
    }

    #[test]
    fn a_queued_request_that_leaves_frees_its_place() {
        let table = Arc::new(Table::new());
        let first = admit(&table, &["1"], OnDuplicate::Queue);
        let Admission::Queued {
            registration: second,
            ..
        } = admit(&table, &["1"], OnDuplicate::Queue)
        else {
            panic!("queued expected")
        };
        let Admission::Queued {
            registration: third,
            ticket,
        } = admit(&table, &["1"], OnDuplicate::Queue)
        else {
            panic!("queued expected")
        };
        drop(second);
        end(first);
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(ticket.poll_turn(&mut cx), Poll::Ready(None));
        third.complete();
        assert_drained(&table);
    }

    #[test]
    fn a_batch_with_a_duplicate_is_refused_under_queue() {
        let table = Arc::new(Table::new());
        let _held = admit(&table, &["1"], OnDuplicate::Queue);
        assert!(matches!(
            admit(&table, &["1", "2"], OnDuplicate::Queue),
            Admission::Duplicate { .. }
        ));
    }

    #[test]
    fn an_abandoned_id_shadows_its_reuse_until_it_expires() {
        let table = Arc::new(Table::new());
        let first = admit(&table, &["1"], OnDuplicate::Reject);
        drop(first); // abandoned: never completed
        let stats = table.stats();
        assert_eq!(
            (
                stats.in_flight_requests,
                stats.tracked_sessions,
                stats.abandoned_ids
            ),
            (0, 0, 1)
        );
        let Admission::Admitted {
            registration,
            routes,
        } = admit(&table, &["1"], OnDuplicate::Reject)
        else {
            panic!("reuse after abandoning is never rejected")
        };
        assert!(matches!(
            routes[0],
            Route::Remapped {
                duplicate: false,
                ..
            }
        ));
        registration.complete();

        let short = Config {
            abandoned_id_ttl: Duration::from_nanos(1),
            ..config(OnDuplicate::Reject)
        };
        let table = Arc::new(Table::new());
        let Admission::Admitted { registration, .. } = table.admit(b"s", &["1"], false, &short)
        else {
            panic!("admitted expected")
        };
        drop(registration);
        std::thread::sleep(Duration::from_millis(1));
        let Admission::Admitted {
            registration,
            routes,
        } = table.admit(b"s", &["1"], false, &short)
        else {
            panic!("admitted expected")
        };
        assert_eq!(routes[0], Route::AsIs, "expired");
        assert_eq!(table.stats().abandoned_ids, 0);
        registration.complete();
        assert_drained(&table);
    }

    #[test]
    fn completed_exchanges_leave_nothing_behind() {
        let table = Arc::new(Table::new());
        let Admission::Admitted { registration, .. } =
            admit(&table, &["1", "2"], OnDuplicate::Remap)
        else {
            panic!("admitted expected")
        };
        registration.complete();
        assert_eq!(table.stats().abandoned_ids, 0);
        let session_hash = table.hasher.hash_one(&b"session-a"[..]);
        assert!(table.shard(session_hash).sessions.is_empty());
    }

    #[test]
    fn a_cancelled_request_shadows_its_id_even_after_its_stream_ended() {
        let short = Config {
            abandoned_id_ttl: Duration::from_millis(1),
            ..config(OnDuplicate::Reject)
        };
        let table = Arc::new(Table::new());
        let admit = |table: &Arc<Table>| table.admit(b"s", &["1"], false, &short);
        let first = admit(&table);
        assert!(table.cancel(b"s", "1").is_some());
        let Admission::Admitted {
            routes,
            registration,
        } = admit(&table)
        else {
            panic!("reuse after a cancellation is never rejected")
        };
        assert!(matches!(
            routes[0],
            Route::Remapped {
                duplicate: false,
                ..
            }
        ));
        registration.complete();
        // The server closed the cancelled request's stream, but a handler
        // that ignores cancellation may still answer it.
        end(first);
        assert_eq!(table.stats().abandoned_ids, 1);
        let Admission::Admitted {
            routes,
            registration,
        } = admit(&table)
        else {
            panic!("admitted expected")
        };
        assert!(
            matches!(routes[0], Route::Remapped { .. }),
            "still shadowed"
        );
        registration.complete();
        std::thread::sleep(Duration::from_millis(5));
        let Admission::Admitted {
            routes,
            registration,
        } = admit(&table)
        else {
            panic!("admitted expected")
        };
        assert_eq!(routes[0], Route::AsIs, "the shadow expired");
        registration.complete();
        assert_drained(&table);
        assert_eq!(table.stats().abandoned_ids, 0);
    }

    #[test]
    fn a_cancellation_names_the_client_id_as_it_was_written() {
        let long = "\"a-request-id-longer-than-an-inline-key\"";
        let cases = [
            ("7", "\"7\""),
            ("\"abc\"", "\"abc\""),
            ("\"\\u0061\"", "\"a\""),
            ("-0", "0"),
            ("\"a\\\"b\"", "\"a\\\"b\""),
            (long, long),
            (
                "123456789012345678901234567890",
                "\"123456789012345678901234567890\"",
            ),
        ];
        for (written, cancelled_as) in cases {
            let table = Arc::new(Table::new());
            let held = admit(&table, &[written], OnDuplicate::Remap);
            assert!(
                matches!(&held, Admission::Admitted { routes, .. } if routes[0] == Route::AsIs)
            );
            assert_eq!(
                table.cancel(b"session-a", cancelled_as).as_deref(),
                Some(written.as_bytes()),
                "{written} cancelled as {cancelled_as}"
            );
            end(held);
        }
    }

    #[test]
    fn long_ids_collide_by_key_within_a_batch_and_across_posts() {
        let table = Arc::new(Table::new());
        let long = "\"a-request-id-longer-than-an-inline-key\"";
        let Admission::Admitted {
            registration,
            routes,
        } = admit(&table, &[long, "1", long], OnDuplicate::Remap)
        else {
            panic!("admitted expected")
        };
        assert_eq!(routes[0], Route::AsIs);
        assert_eq!(routes[1], Route::AsIs);
        assert!(matches!(
            routes[2],
            Route::Remapped {
                duplicate: true,
                ..
            }
        ));
        let Admission::Duplicate { colliding } = admit(&table, &["2", long], OnDuplicate::Reject)
        else {
            panic!("duplicate expected")
        };
        assert_eq!(colliding, [false, true]);
        registration.complete();
        assert_drained(&table);
        let Admission::Admitted {
            registration,
            routes,
        } = admit(&table, &[long], OnDuplicate::Reject)
        else {
            panic!("admitted expected")
        };
        assert_eq!(routes[0], Route::AsIs, "released");
        registration.complete();
        assert_drained(&table);
    }

    #[test]
    fn stats_count_every_shard() {
        let table = Arc::new(Table::new());
        let sessions: Vec<String> = (0..500).map(|n| format!("session-{n}")).collect();
        let held: Vec<Admission> = sessions
            .iter()
            .map(|session| {
                table.admit(
                    session.as_bytes(),
                    &["1", "2"],
                    true,
                    &config(OnDuplicate::Remap),
                )
            })
            .collect();
        let stats = table.stats();
        assert_eq!(
            (stats.in_flight_requests, stats.tracked_sessions),
            (1000, 500)
        );
        assert_eq!((stats.passed_total, stats.remapped_total), (1000, 0));
        let used = table
            .shards
            .iter()
            .filter(|shard| !shard.0.lock().unwrap().sessions.is_empty())
            .count();
        assert!(used > SHARDS / 2, "sessions spread over the shards: {used}");
        held.into_iter().for_each(end);
        assert_drained(&table);
        assert!(table
            .shards
            .iter()
            .all(|shard| shard.0.lock().unwrap().sessions.is_empty()));
    }

    #[test]
    fn rewrite_all_ids_rewrites_unique_ids_too() {
        let table = Arc::new(Table::new());
        let config = Config {
            rewrite_all_ids: true,
            ..config(OnDuplicate::Remap)
        };
        let Admission::Admitted { routes, .. } = table.admit(b"s", &["1", "2"], true, &config)
        else {
            panic!("admitted expected")
        };
        assert!(routes.iter().all(|route| matches!(
            route,
            Route::Remapped {
                duplicate: false,
                ..
            }
        )));
    }

    /// Every way in and out of the table charges and refunds the same bytes:
    /// once nothing is in flight, queued or abandoned, the table holds none.
    #[test]
    fn the_budget_is_given_back_exactly() {
        let short = Config {
            abandoned_id_ttl: Duration::from_millis(1),
            ..config(OnDuplicate::Queue)
        };
        let table = Arc::new(Table::new());
        let long_session = vec![b's'; 300];
        let long_id = format!("\"{}\"", "i".repeat(100));
        let first = table.admit(&long_session, &[&long_id, "1", "-0"], true, &short);
        let stats = table.stats();
        assert!(stats.table_bytes > 300 + 100, "{stats:?}");
        let queued = table.admit(&long_session, &["1"], false, &short);
        assert!(matches!(queued, Admission::Queued { .. }));
        let left = table.admit(&long_session, &["1"], false, &short);
        drop(left); // leaves the queue
        assert!(table.cancel(&long_session, "0").is_some());
        end(first); // grants the queued one
        drop(queued); // abandons it
        let remapped = table.admit(&long_session, &["1"], false, &short);
        end(remapped);
        assert!(table.stats().abandoned_ids > 0);
        std::thread::sleep(Duration::from_millis(5));
        table.cancel(&long_session, "1"); // any use of the shard expires them
        let stats = table.stats();
        assert_eq!(stats.abandoned_ids, 0, "{stats:?}");
        assert_eq!(stats.table_bytes, 0, "{stats:?}");
        assert_drained(&table);
    }

    #[test]
    fn a_full_table_forgets_the_oldest_abandoned_ids_first() {
        let table = Arc::new(Table::new());
        let config = Config {
            max_table_bytes: 8192,
            ..config(OnDuplicate::Remap)
        };
        // Abandon ids in distinct sessions until the table is nearly full.
        let mut abandoned = 0;
        while table.stats().table_bytes + 1024 < config.max_table_bytes {
            let session = format!("session-{abandoned}");
            drop(table.admit(session.as_bytes(), &["1"], false, &config));
            abandoned += 1;
        }
        assert!(abandoned > 3);
        assert_eq!(table.stats().abandoned_ids, abandoned);
        // A request that needs room: the oldest abandoned id goes first.
        let long_id = format!("\"{}\"", "x".repeat(1000));
        let held = table.admit(b"newcomer", &[&long_id], false, &config);
        assert!(matches!(held, Admission::Admitted { .. }));
        let stats = table.stats();
        assert!(stats.abandoned_evicted_total > 0, "{stats:?}");
        assert!(stats.table_bytes <= config.max_table_bytes, "{stats:?}");
        let reuse = |n: usize| {
            let session = format!("session-{n}");
            let Admission::Admitted {
                routes,
                registration,
            } = table.admit(session.as_bytes(), &["1"], false, &config)
            else {
                panic!("admitted expected")
            };
            registration.complete();
            routes[0] == Route::AsIs
        };
        assert!(reuse(0), "the oldest was forgotten");
        assert!(!reuse(abandoned - 1), "the newest is still abandoned");
        end(held);
    }

    #[test]
    fn a_request_that_cannot_fit_is_refused_and_registers_nothing() {
        let table = Arc::new(Table::new());
        let config = Config {
            max_table_bytes: 2048,
            max_in_flight_per_session: 1 << 20,
            ..config(OnDuplicate::Remap)
        };
        let mut held = Vec::new();
        loop {
            let id = held.len().to_string();
            match table.admit(b"s", &[&id], false, &config) {
                admitted @ Admission::Admitted { .. } => held.push(admitted),
                Admission::OverBudget => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        let stats = table.stats();
        assert!(!held.is_empty());
        assert!(stats.table_bytes <= config.max_table_bytes, "{stats:?}");
        assert_eq!(stats.in_flight_requests, held.len());
        assert_eq!(stats.rejected_total, 1);
        held.into_iter().for_each(end);
        assert_eq!(table.stats().table_bytes, 0);
    }

    #[test]
    fn over_long_session_ids_are_refused() {
        let table = Arc::new(Table::new());
        let config = Config {
            max_session_id_bytes: 8,
            ..config(OnDuplicate::Remap)
        };
        assert!(matches!(
            table.admit(b"123456789", &["1", "2"], true, &config),
            Admission::SessionIdTooLong
        ));
        assert!(matches!(
            table.admit(b"12345678", &["1"], false, &config),
            Admission::Admitted { .. }
        ));
        let stats = table.stats();
        assert_eq!((stats.rejected_total, stats.passed_total), (2, 1));
    }

    #[test]
    fn during_the_restart_window_unseen_sessions_are_remapped() {
        let table = Arc::new(Table::new());
        let window = Config {
            restart_window: Some(Duration::from_secs(60)),
            ..config(OnDuplicate::Reject)
        };
        table.note_started(b"seen", &window);
        let route = |session: &[u8], config: &Config| {
            let Admission::Admitted {
                routes,
                registration,
            } = table.admit(session, &["1"], false, config)
            else {
                panic!("admitted expected")
            };
            registration.complete();
            matches!(
                routes[0],
                Route::Remapped {
                    duplicate: false,
                    ..
                }
            )
        };
        assert!(route(b"unseen", &window), "an unseen session is remapped");
        assert!(!route(b"seen", &window), "a session seen starting is not");
        let stats = table.stats();
        assert_eq!((stats.restart_remapped_total, stats.remapped_total), (1, 1));
        assert_eq!(stats.table_bytes, budget::STARTED);
        // Once the window is over, everything is normal and the set freed.
        let over = Config {
            restart_window: Some(Duration::ZERO),
            ..window
        };
        assert!(!route(b"unseen", &over));
        assert_eq!(table.stats().table_bytes, 0);
        table.note_started(b"late", &over);
        assert_eq!(table.stats().table_bytes, 0, "nothing recorded after it");
    }

    #[test]
    fn session_starts_are_not_recorded_past_the_limits() {
        let table = Arc::new(Table::new());
        let config = Config {
            restart_window: Some(Duration::from_secs(60)),
            max_session_id_bytes: 4,
            max_table_bytes: budget::STARTED,
            ..config(OnDuplicate::Remap)
        };
        table.note_started(b"too-long", &config);
        assert_eq!(table.stats().table_bytes, 0);
        table.note_started(b"a", &config);
        table.note_started(b"a", &config);
        table.note_started(b"b", &config);
        assert_eq!(table.stats().table_bytes, budget::STARTED);
    }
}
