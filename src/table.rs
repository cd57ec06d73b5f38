//! The session table: which ids each session has in flight, the one decision
//! function over it, and the guard that releases a request's entries.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::id::{id_key, is_reserved, IdKey, IdMinter};
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
    pub(crate) minter: IdMinter,
    in_flight: AtomicUsize,
    sessions: AtomicUsize,
    passed_total: AtomicU64,
    remapped_total: AtomicU64,
    rejected_total: AtomicU64,
}

/// One session's in-flight requests.
#[derive(Debug, Default)]
struct Session {
    /// Keys of ids that were forwarded unchanged and are still in flight: the
    /// ids the inner server can see. Remapped ids are unique by construction
    /// and need no entry.
    forwarded: HashSet<IdKey>,
    /// All in-flight requests of the session, remapped ones included.
    in_flight: usize,
}

/// How one admitted request goes to the inner service.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// With the client's own id.
    AsIs,
    /// With `server_id` (JSON text) instead; `duplicate` tells a collision
    /// from a client id in the reserved namespace.
    Remapped { server_id: Vec<u8>, duplicate: bool },
}

/// What the decision function says about one POST's requests.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Forward, request `i` as `routes[i]` says.
    Admitted { guard: InFlight, routes: Vec<Route> },
    /// Policy `Reject` and at least one request collides; `colliding[i]` says
    /// which. Nothing was registered.
    Duplicate { colliding: Vec<bool> },
    /// The session is at its in-flight cap. Nothing was registered.
    OverCapacity,
}

impl Table {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_hasher: RandomState::new(),
            minter: IdMinter::new(),
            in_flight: AtomicUsize::new(0),
            sessions: AtomicUsize::new(0),
            passed_total: AtomicU64::new(0),
            remapped_total: AtomicU64::new(0),
            rejected_total: AtomicU64::new(0),
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

    /// The decision function: checks the ids of one POST's requests (in body
    /// order) against the session's in-flight ids and registers them, all under
    /// one lock with no await point, so two racing POSTs cannot both pass.
    pub(crate) fn admit(
        self: &Arc<Self>,
        session: &[u8],
        ids: &[&str],
        policy: OnDuplicate,
        max_in_flight_per_session: usize,
    ) -> Admission {
        let keys: Vec<IdKey> = ids.iter().map(|raw| id_key(raw)).collect();
        let mut shard = self.shard(session);
        let existing = shard.get(session);
        let current = existing.map_or(0, |entry| entry.in_flight);
        if current + ids.len() > max_in_flight_per_session {
            drop(shard);
            self.rejected_total
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            return Admission::OverCapacity;
        }

        // A request collides with an unchanged in-flight id of the session or
        // with an earlier request of the same batch.
        let colliding: Vec<bool> = keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                existing.is_some_and(|entry| entry.forwarded.contains(key))
                    || keys[..index].contains(key)
            })
            .collect();
        if policy == OnDuplicate::Reject && colliding.contains(&true) {
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
        let mut released_keys = Vec::with_capacity(keys.len());
        let mut routes = Vec::with_capacity(keys.len());
        let (mut passed, mut remapped) = (0u64, 0u64);
        for ((raw, key), duplicate) in ids.iter().zip(keys).zip(colliding) {
            if duplicate || is_reserved(&key) {
                routes.push(Route::Remapped {
                    server_id: self.minter.mint(raw),
                    duplicate,
                });
                remapped += 1;
            } else {
                entry.forwarded.insert(key.clone());
                released_keys.push(key);
                routes.push(Route::AsIs);
                passed += 1;
            }
        }
        entry.in_flight += ids.len();
        drop(shard);

        self.in_flight.fetch_add(ids.len(), Ordering::Relaxed);
        self.passed_total.fetch_add(passed, Ordering::Relaxed);
        self.remapped_total.fetch_add(remapped, Ordering::Relaxed);
        Admission::Admitted {
            guard: InFlight {
                table: Arc::clone(self),
                session: stored_session,
                keys: released_keys,
                count: ids.len(),
            },
            routes,
        }
    }

    fn release(&self, session: &[u8], keys: &[IdKey], count: usize) {
        let mut shard = self.shard(session);
        let emptied = match shard.get_mut(session) {
            Some(entry) => {
                for key in keys {
                    entry.forwarded.remove(key);
                }
                entry.in_flight = entry.in_flight.saturating_sub(count);
                entry.in_flight == 0
            }
            None => false,
        };
        if emptied {
            shard.remove(session);
        }
        drop(shard);
        if emptied {
            self.sessions.fetch_sub(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(count, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            in_flight_requests: self.in_flight.load(Ordering::Relaxed),
            tracked_sessions: self.sessions.load(Ordering::Relaxed),
            passed_total: self.passed_total.load(Ordering::Relaxed),
            remapped_total: self.remapped_total.load(Ordering::Relaxed),
            rejected_total: self.rejected_total.load(Ordering::Relaxed),
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
    keys: Vec<IdKey>,
    count: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.table.release(&self.session, &self.keys, self.count);
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

    fn admit(table: &Arc<Table>, ids: &[&str], policy: OnDuplicate) -> Admission {
        table.admit(b"session-a", ids, policy, 8)
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
        let stats = table.stats();
        assert_eq!((stats.in_flight_requests, stats.tracked_sessions), (0, 0));
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
            table.admit(b"session-b", &["1"], OnDuplicate::Remap, 8),
            Admission::Admitted { .. }
        ));
    }
}
