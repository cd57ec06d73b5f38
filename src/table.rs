//! The session table: which ids each session has in flight, the one decision
//! function over it, cancellation, the queue of waiting duplicates, and the
//! guard that releases a request's entries.
//!
//! # Why ids outlive some exchanges
//! The server may still answer a request after the client stopped caring:
//! after a disconnect (the spec says a disconnect is not a cancellation), or
//! after `notifications/cancelled` when the handler does not stop. If the
//! client's id were handed back as-is to the next request, that late answer
//! would be routed to it: one user's data to another. So an entry whose
//! server-visible id is the client's own *shadows* that id while the server may
//! still answer it — until its exchange ends normally, or, once abandoned,
//! for `abandoned_id_ttl`. A new request with a shadowed id is never refused:
//! it goes with a server-side id, whatever the policy.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::id::{id_key, is_reserved, IdKey, IdMinter};
use crate::layer::Config;
use crate::stats::Stats;
use crate::OnDuplicate;

/// Independent locks, so that sessions on different shards never wait for
/// each other. A power of two keeps the shard pick a mask.
const SHARDS: usize = 64;

/// At most this many abandoned ids are kept (per layer), so a client that
/// disconnects in a loop cannot grow memory without bound; past it, an
/// abandoned id is released at once (and logged).
const MAX_ABANDONED: usize = 65_536;

/// One lock's worth of sessions.
type Shard = Mutex<ShardState>;

#[derive(Debug, Default)]
struct ShardState {
    /// Sessions with requests in flight or abandoned ids, by raw session id.
    sessions: HashMap<Arc<[u8]>, Session>,
    /// Abandoned ids in the order they were abandoned, which is also the
    /// order they expire in (one TTL per layer).
    abandoned: VecDeque<Abandoned>,
}

/// Where an abandoned id sits, to drop it when it expires.
#[derive(Debug)]
struct Abandoned {
    expires: Instant,
    session: Arc<[u8]>,
    key: IdKey,
    serial: u64,
}

/// State shared by a layer and every service built from it.
#[derive(Debug)]
pub(crate) struct Table {
    shards: Box<[Shard]>,
    shard_hasher: RandomState,
    minter: IdMinter,
    serials: AtomicU64,
    in_flight: AtomicUsize,
    sessions: AtomicUsize,
    abandoned: AtomicUsize,
    passed_total: AtomicU64,
    remapped_total: AtomicU64,
    rejected_total: AtomicU64,
    queued_total: AtomicU64,
    cancelled_total: AtomicU64,
    restored_total: AtomicU64,
}

/// One session's requests.
#[derive(Debug, Default)]
struct Session {
    /// Entries and waiters by the collision key of the client's id.
    by_key: HashMap<IdKey, KeyState>,
    /// Requests of the session whose exchange has not ended, queued and
    /// cancelled ones included: what the per-session cap counts.
    in_flight: usize,
}

impl Session {
    fn is_empty(&self) -> bool {
        self.in_flight == 0 && self.by_key.is_empty()
    }
}

/// The requests of one session that share a client id.
#[derive(Debug, Default)]
struct KeyState {
    /// Forwarded requests, oldest first.
    entries: VecDeque<Entry>,
    /// Requests waiting for the id under [`OnDuplicate::Queue`], first come
    /// first served.
    waiters: VecDeque<Arc<Waiter>>,
}

/// One forwarded request.
#[derive(Debug)]
struct Entry {
    serial: u64,
    /// The JSON text of the id the inner server knows the request by.
    server_id: Arc<[u8]>,
    /// `server_id` was minted by a guard (else it is the client's own id).
    remapped: bool,
    /// A `notifications/cancelled` named it.
    cancelled: bool,
    /// Its exchange ended before the response did.
    abandoned: bool,
    /// The request has been handed to the inner service. A queued request
    /// holds its entry from the moment its turn comes until its future
    /// forwards it; a cancellation must not name it before the server has it.
    at_server: bool,
}

impl Entry {
    /// The client still waits for it.
    fn is_live(&self) -> bool {
        !self.cancelled && !self.abandoned
    }

    /// The server may still answer it under the client's own id, though the
    /// client no longer waits for that answer.
    fn shadows(&self) -> bool {
        !self.remapped && !self.is_live()
    }
}

impl KeyState {
    /// Whether a new request with this id is a duplicate for the policy, or
    /// others already wait for it.
    ///
    /// Under `Remap` only a live request the server knows by the client's own
    /// id counts: the newcomer is remapped, later ones too, and the first to
    /// arrive after that request ended goes as-is again. Under `Reject` and
    /// `Queue`, and whenever every id is rewritten, any live request of the
    /// client with this id counts, remapped or not (a request remapped past a
    /// shadow is still in flight under the client's id).
    fn is_taken(&self, any_live: bool) -> bool {
        !self.waiters.is_empty() || self.blocks(any_live)
    }

    fn blocks(&self, any_live: bool) -> bool {
        self.entries
            .iter()
            .any(|entry| entry.is_live() && (any_live || !entry.remapped))
    }

    /// Whether a new request with this id must go with a server-side id.
    fn is_shadowed(&self) -> bool {
        self.entries.iter().any(Entry::shadows)
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.waiters.is_empty()
    }
}

/// How one admitted request goes to the inner service.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// With the client's own id.
    AsIs,
    /// With `server_id` (JSON text) instead; `duplicate` tells a collision
    /// from a shadowed id, a client id in the reserved namespace or
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
    Admitted { guard: InFlight, routes: Vec<Route> },
    /// Policy `Queue`: wait for the ticket, then forward as it says. The
    /// guard already counts the request.
    Queued {
        guard: InFlight,
        ticket: Arc<Waiter>,
    },
    /// A collision the policy refuses (`Reject`, or a batch under `Queue`);
    /// `colliding[i]` says which. Nothing was registered.
    Duplicate { colliding: Vec<bool> },
    /// The session is at its in-flight cap. Nothing was registered.
    OverCapacity,
}

/// A queued request's place in line.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The client's id JSON text, to mint a server-side id at grant time.
    raw_id: Box<str>,
    /// Go with a server-side id whatever the key's state: `rewrite_all_ids`,
    /// or a client id in the reserved namespace.
    always_remap: bool,
    state: Mutex<WaitState>,
}

#[derive(Debug)]
enum WaitState {
    Waiting(Option<Waker>),
    /// The id is this request's now, as this entry; `remap` is the
    /// server-side id to use, if any.
    Granted {
        serial: u64,
        remap: Option<Arc<[u8]>>,
    },
}

impl Waiter {
    fn lock(&self) -> MutexGuard<'_, WaitState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ready with the server-side id to use (`None`: the client's own) once
    /// the request's turn has come.
    pub(crate) fn poll_turn(&self, cx: &mut Context<'_>) -> Poll<Option<Arc<[u8]>>> {
        let mut state = self.lock();
        match &mut *state {
            WaitState::Granted { remap, .. } => Poll::Ready(remap.clone()),
            WaitState::Waiting(waker) => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Table {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_hasher: RandomState::new(),
            minter: IdMinter::new(),
            serials: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            sessions: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
            passed_total: AtomicU64::new(0),
            remapped_total: AtomicU64::new(0),
            rejected_total: AtomicU64::new(0),
            queued_total: AtomicU64::new(0),
            cancelled_total: AtomicU64::new(0),
            restored_total: AtomicU64::new(0),
        }
    }

    /// A short, non-reversible tag of a session id for logs: session ids are
    /// bearer secrets and are never logged raw.
    pub(crate) fn session_tag(&self, session: &[u8]) -> String {
        format!("{:08x}", self.shard_hasher.hash_one(session) >> 32)
    }

    fn shard(&self, session: &[u8]) -> MutexGuard<'_, ShardState> {
        let index = self.shard_hasher.hash_one(session) as usize & (SHARDS - 1);
        // Nothing panics while a shard is held, but a poisoned lock must not
        // turn into leaked entries: the data is still consistent.
        let mut shard = self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.expire_abandoned(&mut shard);
        shard
    }

    fn next_serial(&self) -> u64 {
        self.serials.fetch_add(1, Ordering::Relaxed)
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
        let keys: Vec<IdKey> = ids.iter().map(|raw| id_key(raw)).collect();
        let mut shard = self.shard(session);
        let existing = shard.sessions.get(session);
        let current = existing.map_or(0, |entry| entry.in_flight);
        if current + ids.len() > config.max_in_flight_per_session {
            drop(shard);
            self.rejected_total
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            return Admission::OverCapacity;
        }

        // A request collides with a live request of the session with the same
        // id (see `KeyState::is_taken`), and with an earlier request of the
        // same batch.
        let any_live_collides = config.on_duplicate != OnDuplicate::Remap || config.rewrite_all_ids;
        let state_of = |key: &IdKey| existing.and_then(|entry| entry.by_key.get(key));
        let colliding: Vec<bool> = keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                state_of(key).is_some_and(|state| state.is_taken(any_live_collides))
                    || keys[..index].contains(key)
            })
            .collect();
        let shadowed: Vec<bool> = keys
            .iter()
            .map(|key| state_of(key).is_some_and(KeyState::is_shadowed))
            .collect();
        let any_collision = colliding.contains(&true);
        // Only a lone request waits; holding a whole batch for one member
        // would delay its other requests behind unrelated work.
        let queue_single = config.on_duplicate == OnDuplicate::Queue && !is_batch;
        let refuse = match config.on_duplicate {
            OnDuplicate::Remap => false,
            OnDuplicate::Queue => !queue_single,
            OnDuplicate::Reject => true,
        };
        if any_collision && refuse {
            drop(shard);
            self.rejected_total
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            return Admission::Duplicate { colliding };
        }

        // Reuse the stored key so an existing session costs no allocation.
        let stored_session = match shard.sessions.get_key_value(session) {
            Some((stored, _)) => Arc::clone(stored),
            None => Arc::from(session),
        };
        let entry = shard
            .sessions
            .entry(Arc::clone(&stored_session))
            .or_default();
        if entry.in_flight == 0 {
            self.sessions.fetch_add(1, Ordering::Relaxed);
        }
        entry.in_flight += ids.len();
        self.in_flight.fetch_add(ids.len(), Ordering::Relaxed);

        let guard = |members, queued| InFlight {
            table: Arc::clone(self),
            session: Arc::clone(&stored_session),
            members,
            queued,
            count: ids.len(),
            completed: false,
            abandoned_id_ttl: config.abandoned_id_ttl,
            awaits_responses: config.on_duplicate != OnDuplicate::Remap,
        };

        if any_collision && queue_single {
            let ticket = Arc::new(Waiter {
                raw_id: ids[0].into(),
                always_remap: config.rewrite_all_ids || is_reserved(&keys[0]),
                state: Mutex::new(WaitState::Waiting(None)),
            });
            let key = keys.into_iter().next().unwrap_or_default();
            entry
                .by_key
                .entry(key.clone())
                .or_default()
                .waiters
                .push_back(Arc::clone(&ticket));
            drop(shard);
            self.queued_total.fetch_add(1, Ordering::Relaxed);
            return Admission::Queued {
                guard: guard(Vec::new(), Some((key, Arc::clone(&ticket)))),
                ticket,
            };
        }

        let mut members = Vec::with_capacity(keys.len());
        let mut routes = Vec::with_capacity(keys.len());
        let (mut passed, mut remapped) = (0u64, 0u64);
        let decisions = ids.iter().zip(keys).zip(colliding).zip(shadowed);
        for (((raw, key), duplicate), shadowed) in decisions {
            let serial = self.next_serial();
            let remap = duplicate || shadowed || is_reserved(&key) || config.rewrite_all_ids;
            let server_id = if remap {
                remapped += 1;
                let server_id = self.mint(raw);
                routes.push(Route::Remapped {
                    server_id: Arc::clone(&server_id),
                    duplicate,
                });
                server_id
            } else {
                passed += 1;
                routes.push(Route::AsIs);
                Arc::from(raw.as_bytes())
            };
            entry
                .by_key
                .entry(key.clone())
                .or_default()
                .entries
                .push_back(Entry {
                    serial,
                    server_id,
                    remapped: remap,
                    cancelled: false,
                    abandoned: false,
                    at_server: true,
                });
            members.push((key, serial));
        }
        drop(shard);

        self.passed_total.fetch_add(passed, Ordering::Relaxed);
        self.remapped_total.fetch_add(remapped, Ordering::Relaxed);
        Admission::Admitted {
            guard: guard(members, None),
            routes,
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
        let key = id_key(request_id);
        let mut shard = self.shard(session);
        let state = shard.sessions.get_mut(session)?.by_key.get_mut(&key)?;
        // The request the server knows by the client's own id, if any; else
        // the oldest remapped one.
        let position = state
            .entries
            .iter()
            .position(|entry| entry.at_server && !entry.cancelled && !entry.remapped)
            .or_else(|| {
                state
                    .entries
                    .iter()
                    .position(|entry| entry.at_server && !entry.cancelled)
            })?;
        let target = &mut state.entries[position];
        target.cancelled = true;
        let server_id = Arc::clone(&target.server_id);
        self.grant_waiters(state);
        drop(shard);
        self.cancelled_total.fetch_add(1, Ordering::Relaxed);
        Some(server_id)
    }

    /// Hands the id to waiting requests, first come first served, while the
    /// client has no live request with it.
    fn grant_waiters(&self, state: &mut KeyState) {
        while let Some(waiter) = state.waiters.front() {
            // Waiters exist only under `Queue`, where any live request blocks.
            if state.blocks(true) {
                return;
            }
            let serial = self.next_serial();
            let remap =
                (waiter.always_remap || state.is_shadowed()).then(|| self.mint(&waiter.raw_id));
            let server_id = remap
                .clone()
                .unwrap_or_else(|| Arc::from(waiter.raw_id.as_bytes()));
            let mut wait_state = waiter.lock();
            if let WaitState::Waiting(waker) = &mut *wait_state {
                if let Some(waker) = waker.take() {
                    waker.wake();
                }
            }
            *wait_state = WaitState::Granted {
                serial,
                remap: remap.clone(),
            };
            drop(wait_state);
            state.entries.push_back(Entry {
                serial,
                server_id,
                remapped: remap.is_some(),
                cancelled: false,
                abandoned: false,
                at_server: false,
            });
            state.waiters.pop_front();
        }
    }

    fn release(&self, guard: &InFlight) {
        let mut shard = self.shard(&guard.session);
        let shard = &mut *shard;
        let Some(session) = shard.sessions.get_mut(&*guard.session) else {
            self.in_flight.fetch_sub(guard.count, Ordering::Relaxed);
            return;
        };
        // An exchange that did not end normally may still be answered by the
        // server; keep its ids shadowed for a while. So may a cancelled one,
        // even when the server closed its stream: a handler that ignores the
        // cancellation still answers, under the client's id.
        let keep_until = (!guard.abandoned_id_ttl.is_zero())
            .then(|| Instant::now().checked_add(guard.abandoned_id_ttl))
            .flatten();
        let completed = guard.completed;
        let mut ended: Vec<(&IdKey, u64)> = guard
            .members
            .iter()
            .map(|(key, serial)| (key, *serial))
            .collect();
        if let Some((key, ticket)) = &guard.queued {
            match &*ticket.lock() {
                WaitState::Granted { serial, .. } => ended.push((key, *serial)),
                WaitState::Waiting(_) => remove_waiter(session, key, ticket),
            }
        }
        for (key, serial) in ended {
            if let Some(expires) = self.end_entry(session, key, serial, completed, keep_until) {
                shard.abandoned.push_back(Abandoned {
                    expires,
                    session: Arc::clone(&guard.session),
                    key: key.clone(),
                    serial,
                });
            }
        }
        session.in_flight = session.in_flight.saturating_sub(guard.count);
        let idle = session.in_flight == 0;
        if session.is_empty() {
            shard.sessions.remove(&*guard.session);
        }
        if idle {
            self.sessions.fetch_sub(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(guard.count, Ordering::Relaxed);
    }

    /// Ends a forwarded request's entry: removes it, or, when the server
    /// knows it by the client's own id and may still answer it (the exchange
    /// did not complete, or it was cancelled), keeps it as abandoned until
    /// `keep_until` (returned). Passes the id on to the next waiter.
    fn end_entry(
        &self,
        session: &mut Session,
        key: &IdKey,
        serial: u64,
        completed: bool,
        keep_until: Option<Instant>,
    ) -> Option<Instant> {
        let state = session.by_key.get_mut(key)?;
        let mut kept = None;
        if let Some(position) = state
            .entries
            .iter()
            .position(|entry| entry.serial == serial)
        {
            let entry = &mut state.entries[position];
            let may_still_answer = !entry.remapped && (!completed || entry.cancelled);
            let keep = keep_until.filter(|_| {
                may_still_answer && self.abandoned.load(Ordering::Relaxed) < MAX_ABANDONED
            });
            match keep {
                Some(expires) => {
                    entry.abandoned = true;
                    self.abandoned.fetch_add(1, Ordering::Relaxed);
                    kept = Some(expires);
                }
                None => {
                    if keep_until.is_some() && may_still_answer {
                        tracing::warn!(
                            limit = MAX_ABANDONED,
                            "too many abandoned ids; releasing one at once"
                        );
                    }
                    state.entries.remove(position);
                }
            }
            self.grant_waiters(state);
        }
        if state.is_empty() {
            session.by_key.remove(key);
        }
        kept
    }

    /// Drops abandoned ids whose time is up, and sessions left empty.
    /// Amortised O(1): expiries are in order.
    fn expire_abandoned(&self, shard: &mut ShardState) {
        let now = Instant::now();
        while shard
            .abandoned
            .front()
            .is_some_and(|first| first.expires <= now)
        {
            let Some(expired) = shard.abandoned.pop_front() else {
                break;
            };
            let Some(session) = shard.sessions.get_mut(&*expired.session) else {
                continue;
            };
            if let Some(state) = session.by_key.get_mut(&expired.key) {
                let position = state
                    .entries
                    .iter()
                    .position(|entry| entry.serial == expired.serial && entry.abandoned);
                if let Some(position) = position {
                    state.entries.remove(position);
                    self.abandoned.fetch_sub(1, Ordering::Relaxed);
                    self.grant_waiters(state);
                }
                if state.is_empty() {
                    session.by_key.remove(&expired.key);
                }
            }
            if session.is_empty() {
                shard.sessions.remove(&*expired.session);
            }
        }
    }

    /// Records that a queued request whose turn came has been handed to the
    /// inner service.
    fn mark_forwarded(&self, guard: &InFlight) {
        let Some((key, ticket)) = &guard.queued else {
            return;
        };
        let WaitState::Granted { serial, .. } = *ticket.lock() else {
            return;
        };
        let mut shard = self.shard(&guard.session);
        let entry = shard
            .sessions
            .get_mut(&*guard.session)
            .and_then(|session| session.by_key.get_mut(key))
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
        Stats {
            in_flight_requests: self.in_flight.load(Ordering::Relaxed),
            tracked_sessions: self.sessions.load(Ordering::Relaxed),
            abandoned_ids: self.abandoned.load(Ordering::Relaxed),
            passed_total: self.passed_total.load(Ordering::Relaxed),
            remapped_total: self.remapped_total.load(Ordering::Relaxed),
            rejected_total: self.rejected_total.load(Ordering::Relaxed),
            queued_total: self.queued_total.load(Ordering::Relaxed),
            cancelled_total: self.cancelled_total.load(Ordering::Relaxed),
            restored_total: self.restored_total.load(Ordering::Relaxed),
        }
    }
}

fn remove_waiter(session: &mut Session, key: &IdKey, ticket: &Arc<Waiter>) {
    let Some(state) = session.by_key.get_mut(key) else {
        return;
    };
    state.waiters.retain(|waiter| !Arc::ptr_eq(waiter, ticket));
    if state.is_empty() {
        session.by_key.remove(key);
    }
}

/// The registration of one POST's requests. Dropping it releases them,
/// exactly once: it lives in the response future and then in the response
/// body, so every way an exchange can end (body finished or dropped, future
/// dropped, inner error, panic unwinding) drops it. Only
/// [`complete`](Self::complete) tells the table the server has answered;
/// any other end leaves the ids shadowed for `abandoned_id_ttl`.
#[derive(Debug)]
pub(crate) struct InFlight {
    table: Arc<Table>,
    session: Arc<[u8]>,
    /// Forwarded requests: (collision key, entry serial).
    members: Vec<(IdKey, u64)>,
    /// A queued request: its key and ticket (granted or not).
    queued: Option<(IdKey, Arc<Waiter>)>,
    count: usize,
    completed: bool,
    abandoned_id_ttl: Duration,
    /// Free the ids as soon as their responses have passed (policies that
    /// turn a collision into a visible refusal or a wait).
    awaits_responses: bool,
}

impl InFlight {
    /// The collision keys of the requests whose responses end the exchange
    /// early, or nothing when the policy does not need it.
    pub(crate) fn awaited_keys(&self) -> Vec<IdKey> {
        if !self.awaits_responses {
            return Vec::new();
        }
        self.members
            .iter()
            .map(|(key, _)| key.clone())
            .chain(self.queued.iter().map(|(key, _)| key.clone()))
            .collect()
    }

    pub(crate) fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// Records that the request, queued until now, goes to the inner service.
    pub(crate) fn forwarded(&self) {
        self.table.mark_forwarded(self);
    }

    /// Releases the ids of an exchange that ended normally: the server has
    /// answered, so nothing is kept.
    pub(crate) fn complete(mut self) {
        self.completed = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.table.release(self);
        tracing::debug!(
            session = %self.table.session_tag(&self.session),
            requests = self.count,
            completed = self.completed,
            "released in-flight ids"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    fn config(on_duplicate: OnDuplicate) -> Config {
        Config {
            on_duplicate,
            max_in_flight_per_session: 8,
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
            Admission::Admitted { guard, .. } | Admission::Queued { guard, .. } => guard.complete(),
            Admission::Duplicate { .. } | Admission::OverCapacity => {}
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
            guard: second,
            ticket: second_ticket,
        } = admit(&table, &["1"], OnDuplicate::Queue)
        else {
            panic!("queued expected")
        };
        let Admission::Queued {
            guard: third,
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
        let Admission::Queued { guard: second, .. } = admit(&table, &["1"], OnDuplicate::Queue)
        else {
            panic!("queued expected")
        };
        let Admission::Queued {
            guard: third,
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
        let Admission::Admitted { guard, routes } = admit(&table, &["1"], OnDuplicate::Reject)
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
        guard.complete();

        let short = Config {
            abandoned_id_ttl: Duration::from_nanos(1),
            ..config(OnDuplicate::Reject)
        };
        let table = Arc::new(Table::new());
        let Admission::Admitted { guard, .. } = table.admit(b"s", &["1"], false, &short) else {
            panic!("admitted expected")
        };
        drop(guard);
        std::thread::sleep(Duration::from_millis(1));
        let Admission::Admitted { guard, routes } = table.admit(b"s", &["1"], false, &short) else {
            panic!("admitted expected")
        };
        assert_eq!(routes[0], Route::AsIs, "expired");
        assert_eq!(table.stats().abandoned_ids, 0);
        guard.complete();
        assert_drained(&table);
    }

    #[test]
    fn completed_exchanges_leave_nothing_behind() {
        let table = Arc::new(Table::new());
        let Admission::Admitted { guard, .. } = admit(&table, &["1", "2"], OnDuplicate::Remap)
        else {
            panic!("admitted expected")
        };
        guard.complete();
        assert_eq!(table.stats().abandoned_ids, 0);
        assert!(table.shard(b"session-a").sessions.is_empty());
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
        let Admission::Admitted { routes, guard } = admit(&table) else {
            panic!("reuse after a cancellation is never rejected")
        };
        assert!(matches!(
            routes[0],
            Route::Remapped {
                duplicate: false,
                ..
            }
        ));
        guard.complete();
        // The server closed the cancelled request's stream, but a handler
        // that ignores cancellation may still answer it.
        end(first);
        assert_eq!(table.stats().abandoned_ids, 1);
        let Admission::Admitted { routes, guard } = admit(&table) else {
            panic!("admitted expected")
        };
        assert!(
            matches!(routes[0], Route::Remapped { .. }),
            "still shadowed"
        );
        guard.complete();
        std::thread::sleep(Duration::from_millis(5));
        let Admission::Admitted { routes, guard } = admit(&table) else {
            panic!("admitted expected")
        };
        assert_eq!(routes[0], Route::AsIs, "the shadow expired");
        guard.complete();
        assert_drained(&table);
        assert_eq!(table.stats().abandoned_ids, 0);
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
}
