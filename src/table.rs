//! The session table: which ids each session has in flight, the one decision
//! function over it, cancellation, the queue of waiting duplicates, and the
//! guard that releases a request's entries.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::id::{id_key, is_reserved, IdKey, IdMinter};
use crate::layer::Config;
use crate::stats::Stats;
use crate::OnDuplicate;

/// Independent locks, so that sessions on different shards never wait for
/// each other. A power of two keeps the shard pick a mask.
const SHARDS: usize = 64;

/// One lock's worth of sessions, keyed by the raw session id.
type Shard = Mutex<HashMap<Arc<[u8]>, Session>>;

/// State shared by a layer and every service built from it.
#[derive(Debug)]
pub(crate) struct Table {
    shards: Box<[Shard]>,
    shard_hasher: RandomState,
    minter: IdMinter,
    serials: AtomicU64,
    in_flight: AtomicUsize,
    sessions: AtomicUsize,
    passed_total: AtomicU64,
    remapped_total: AtomicU64,
    rejected_total: AtomicU64,
    queued_total: AtomicU64,
    cancelled_total: AtomicU64,
    restored_total: AtomicU64,
}

/// One session's in-flight requests.
#[derive(Debug, Default)]
struct Session {
    /// Requests in flight (forwarded or queued), by the collision key of the
    /// client's id.
    by_key: HashMap<IdKey, KeyState>,
    /// Requests of the session whose exchange has not ended, queued and
    /// cancelled ones included: what the per-session cap counts.
    in_flight: usize,
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
    /// The id the inner server knows it by: `None` for the client's own id.
    server_id: Option<Arc<[u8]>>,
}

impl KeyState {
    /// Whether a new request with this id must be treated as a duplicate:
    /// the server already knows a request by this id (or, when every id is
    /// rewritten, the client has one in flight), or others already wait.
    fn is_taken(&self, rewrite_all: bool) -> bool {
        !self.waiters.is_empty() || self.blocks_waiters(rewrite_all)
    }

    fn blocks_waiters(&self, rewrite_all: bool) -> bool {
        self.entries
            .iter()
            .any(|entry| rewrite_all || entry.server_id.is_none())
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
    /// from a client id in the reserved namespace or `rewrite_all_ids`.
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
    rewrite_all: bool,
    state: Mutex<WaitState>,
}

#[derive(Debug)]
enum WaitState {
    Waiting(Option<Waker>),
    /// The id is this request's now, as this entry.
    Granted {
        serial: u64,
        server_id: Option<Arc<[u8]>>,
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
            WaitState::Granted { server_id, .. } => Poll::Ready(server_id.clone()),
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

    fn shard(&self, session: &[u8]) -> MutexGuard<'_, HashMap<Arc<[u8]>, Session>> {
        let index = self.shard_hasher.hash_one(session) as usize & (SHARDS - 1);
        // Nothing panics while a shard is held, but a poisoned lock must not
        // turn into leaked entries: the data is still consistent.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn next_serial(&self) -> u64 {
        self.serials.fetch_add(1, Ordering::Relaxed)
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
        let existing = shard.get(session);
        let current = existing.map_or(0, |entry| entry.in_flight);
        if current + ids.len() > config.max_in_flight_per_session {
            drop(shard);
            self.rejected_total
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            return Admission::OverCapacity;
        }

        // A request collides with a request of the session the server knows
        // by the same id, and with an earlier request of the same batch.
        let colliding: Vec<bool> = keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                existing
                    .and_then(|entry| entry.by_key.get(key))
                    .is_some_and(|state| state.is_taken(config.rewrite_all_ids))
                    || keys[..index].contains(key)
            })
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
        let stored_session = match shard.get_key_value(session) {
            Some((stored, _)) => Arc::clone(stored),
            None => Arc::from(session),
        };
        let entry = shard.entry(Arc::clone(&stored_session)).or_insert_with(|| {
            self.sessions.fetch_add(1, Ordering::Relaxed);
            Session::default()
        });
        entry.in_flight += ids.len();
        self.in_flight.fetch_add(ids.len(), Ordering::Relaxed);

        if any_collision && queue_single {
            let ticket = Arc::new(Waiter {
                raw_id: ids[0].into(),
                rewrite_all: config.rewrite_all_ids,
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
            let guard = InFlight {
                table: Arc::clone(self),
                session: stored_session,
                members: Vec::new(),
                queued: Some((key, Arc::clone(&ticket))),
                count: 1,
            };
            return Admission::Queued { guard, ticket };
        }

        let mut members = Vec::with_capacity(keys.len());
        let mut routes = Vec::with_capacity(keys.len());
        let (mut passed, mut remapped) = (0u64, 0u64);
        for ((raw, key), duplicate) in ids.iter().zip(keys).zip(colliding) {
            let serial = self.next_serial();
            let server_id = (duplicate || is_reserved(&key) || config.rewrite_all_ids)
                .then(|| Arc::from(self.minter.mint(raw)));
            routes.push(match &server_id {
                Some(server_id) => {
                    remapped += 1;
                    Route::Remapped {
                        server_id: Arc::clone(server_id),
                        duplicate,
                    }
                }
                None => {
                    passed += 1;
                    Route::AsIs
                }
            });
            entry
                .by_key
                .entry(key.clone())
                .or_default()
                .entries
                .push_back(Entry { serial, server_id });
            members.push((key, serial));
        }
        drop(shard);

        self.passed_total.fetch_add(passed, Ordering::Relaxed);
        self.remapped_total.fetch_add(remapped, Ordering::Relaxed);
        Admission::Admitted {
            guard: InFlight {
                table: Arc::clone(self),
                session: stored_session,
                members,
                queued: None,
                count: ids.len(),
            },
            routes,
        }
    }

    /// Handles a `notifications/cancelled` naming `request_id` in `session`.
    ///
    /// The cancellation goes to the **oldest** forwarded request of the session
    /// with that id. That is the one the server knows by the client's own id
    /// (duplicates arriving later were remapped), so it is exactly the request
    /// an unguarded server would have cancelled; it is also the one most
    /// likely to still be running. Its id is freed at once, and the next
    /// queued request with that id, if any, gets it.
    ///
    /// Returns `None` when nothing in flight matches (the notification passes
    /// unchanged), else the server-side id to put in `requestId` (`None`
    /// inside: the client's own id is right).
    pub(crate) fn cancel(&self, session: &[u8], request_id: &str) -> Option<Option<Arc<[u8]>>> {
        let key = id_key(request_id);
        let mut shard = self.shard(session);
        let entry = shard.get_mut(session)?;
        let state = entry.by_key.get_mut(&key)?;
        let cancelled = state.entries.pop_front()?;
        self.grant_waiters(state);
        if state.is_empty() {
            entry.by_key.remove(&key);
        }
        drop(shard);
        self.cancelled_total.fetch_add(1, Ordering::Relaxed);
        Some(cancelled.server_id)
    }

    /// Hands the id to waiting requests, first come first served, while the
    /// server knows no request by it.
    fn grant_waiters(&self, state: &mut KeyState) {
        while let Some(waiter) = state.waiters.front() {
            if state.blocks_waiters(waiter.rewrite_all) {
                return;
            }
            let serial = self.next_serial();
            let server_id = waiter
                .rewrite_all
                .then(|| Arc::from(self.minter.mint(&waiter.raw_id)));
            let mut wait_state = waiter.lock();
            if let WaitState::Waiting(waker) = &mut *wait_state {
                if let Some(waker) = waker.take() {
                    waker.wake();
                }
            }
            *wait_state = WaitState::Granted {
                serial,
                server_id: server_id.clone(),
            };
            drop(wait_state);
            state.entries.push_back(Entry { serial, server_id });
            state.waiters.pop_front();
        }
    }

    fn release(&self, guard: &InFlight) {
        let mut shard = self.shard(&guard.session);
        let emptied = match shard.get_mut(&*guard.session) {
            Some(session) => {
                for (key, serial) in &guard.members {
                    self.remove_entry(session, key, *serial);
                }
                if let Some((key, ticket)) = &guard.queued {
                    let granted = match &*ticket.lock() {
                        WaitState::Granted { serial, .. } => Some(*serial),
                        WaitState::Waiting(_) => None,
                    };
                    match granted {
                        Some(serial) => self.remove_entry(session, key, serial),
                        None => self.remove_waiter(session, key, ticket),
                    }
                }
                session.in_flight = session.in_flight.saturating_sub(guard.count);
                session.in_flight == 0
            }
            None => false,
        };
        if emptied {
            shard.remove(&*guard.session);
        }
        drop(shard);
        if emptied {
            self.sessions.fetch_sub(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(guard.count, Ordering::Relaxed);
    }

    /// Removes a forwarded request's entry (already gone if it was
    /// cancelled) and passes the id on to the next waiter.
    fn remove_entry(&self, session: &mut Session, key: &IdKey, serial: u64) {
        let Some(state) = session.by_key.get_mut(key) else {
            return;
        };
        if let Some(position) = state
            .entries
            .iter()
            .position(|entry| entry.serial == serial)
        {
            state.entries.remove(position);
            self.grant_waiters(state);
        }
        if state.is_empty() {
            session.by_key.remove(key);
        }
    }

    fn remove_waiter(&self, session: &mut Session, key: &IdKey, ticket: &Arc<Waiter>) {
        let Some(state) = session.by_key.get_mut(key) else {
            return;
        };
        state.waiters.retain(|waiter| !Arc::ptr_eq(waiter, ticket));
        if state.is_empty() {
            session.by_key.remove(key);
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
            passed_total: self.passed_total.load(Ordering::Relaxed),
            remapped_total: self.remapped_total.load(Ordering::Relaxed),
            rejected_total: self.rejected_total.load(Ordering::Relaxed),
            queued_total: self.queued_total.load(Ordering::Relaxed),
            cancelled_total: self.cancelled_total.load(Ordering::Relaxed),
            restored_total: self.restored_total.load(Ordering::Relaxed),
        }
    }
}

/// The registration of one POST's requests. Dropping it releases them,
/// exactly once: it lives in the response future and then in the response
/// body, so every way an exchange can end (body finished or dropped, future
/// dropped, inner error, panic unwinding) drops it.
#[derive(Debug)]
pub(crate) struct InFlight {
    table: Arc<Table>,
    session: Arc<[u8]>,
    /// Forwarded requests: (collision key, entry serial).
    members: Vec<(IdKey, u64)>,
    /// A queued request: its key and ticket (granted or not).
    queued: Option<(IdKey, Arc<Waiter>)>,
    count: usize,
}

impl InFlight {
    pub(crate) fn table(&self) -> &Arc<Table> {
        &self.table
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.table.release(self);
        tracing::debug!(
            session = %self.table.session_tag(&self.session),
            requests = self.count,
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
        drop(first);
        let third = admit(&table, &["1"], OnDuplicate::Reject);
        assert!(
            matches!(third, Admission::Admitted { .. }),
            "the unchanged slot is free again"
        );
        drop((second, third));
        assert_drained(&table);
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
            table.cancel(b"session-a", "1"),
            Some(None),
            "the oldest went as-is"
        );
        assert_eq!(
            table.cancel(b"session-a", "1"),
            Some(Some(Arc::clone(server_id)))
        );
        assert_eq!(table.cancel(b"session-a", "1"), None);
        let reuse = admit(&table, &["1"], OnDuplicate::Reject);
        assert!(matches!(reuse, Admission::Admitted { .. }), "freed at once");
        assert_eq!(table.stats().cancelled_total, 2);
        drop((first, second, reuse));
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
        drop(first);
        assert_eq!(second_ticket.poll_turn(&mut cx), Poll::Ready(None));
        assert!(third_ticket.poll_turn(&mut cx).is_pending());
        assert_eq!(table.stats().in_flight_requests, 2);
        drop(second);
        assert_eq!(third_ticket.poll_turn(&mut cx), Poll::Ready(None));
        drop(third);
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
        drop(first);
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(ticket.poll_turn(&mut cx), Poll::Ready(None));
        drop(third);
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
