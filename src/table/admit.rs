//! Admission, the one decision function over the table, in four steps:
//! *probe* (hash each id once, before any lock), *reserve* (room in the byte
//! budget for the most the requests can cost), *decide* (collisions against
//! the session's live requests and the batch's earlier ones, under the
//! shard's lock) and *register* (entries for the requests that go, or a
//! place in the queue).

use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hashbrown::hash_table::Entry as Slot;
use hashbrown::HashTable;

use super::awaited::Awaited;
use super::config::{Config, OnDuplicate};
use super::entries::{self, Entry, ServerId};
use super::inline::InlineVec;
use super::queue::{WaitState, Waiter};
use super::registration::Member;
use super::session::{self, KeyState, Probe, Session};
use super::{budget, Decision, Route, SessionRef, ShardState, Table};
use crate::wire::id::is_reserved;

impl Table {
    /// The decision function: checks the ids of one POST's requests (in body
    /// order) against the session's in-flight ids and registers them, all under
    /// one lock with no await point, so two racing POSTs cannot both pass.
    pub(crate) fn admit(
        self: &Arc<Self>,
        session: &[u8],
        ids: &[&str],
        is_batch: bool,
        config: &Config,
    ) -> Decision {
        if session.len() > config.max_session_id_bytes {
            return self.refuse(ids.len(), Decision::SessionIdTooLong);
        }
        let session_hash = self.hasher.hash_one(session);
        // Probe. A lone request, the usual case, needs no vector.
        let mut single: [Probe<'_>; 1];
        let mut many: Vec<Probe<'_>>;
        let probes: &mut [Probe<'_>] = if let [raw] = ids {
            single = [self.probe(raw)];
            &mut single
        } else {
            many = ids.iter().map(|raw| self.probe(raw)).collect();
            &mut many
        };
        let Some(bound) = self.reserve_for(session.len(), probes, config) else {
            return self.refuse(ids.len(), Decision::OverBudget);
        };
        let restarting = self.restart_window_open(config);

        // Decide.
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
            return self.refuse(ids.len(), Decision::OverCapacity);
        }
        // Under `Remap` only a live request the server knows by that very id
        // collides; under the other policies, any live request with it.
        let any_live_collides = config.on_duplicate != OnDuplicate::Remap || config.rewrite_all_ids;
        mark_collisions(existing, probes, any_live_collides);
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
            let colliding = probes.iter().map(|probe| probe.colliding).collect();
            return self.refuse(ids.len(), Decision::Duplicate { colliding });
        }

        // Register. A session that started before this table existed (or
        // without it seeing the start) may have requests at the server that
        // the table knows nothing of: during the restart window, every id of
        // such a session counts as abandoned.
        let unseen = restarting
            && shard
                .started
                .find(session_hash, |started| *started == session_hash)
                .is_none();
        let mut charged = 0;
        let entry = match slot {
            Slot::Occupied(occupied) => occupied.into_mut(),
            Slot::Vacant(vacant) => {
                charged += session::session_cost(session.len());
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
            let (ticket, queued_charge) = enqueue(entry, probe, config, unseen);
            drop(locked);
            self.settle(bound, charged + queued_charge);
            return self.queued(at, probe.hash, ticket, config);
        }

        let forwarded = self.enter(
            session,
            probes,
            entry,
            &mut shard.next_serial,
            Tally {
                charged,
                unseen,
                config,
            },
        );
        shard.passed_total += forwarded.passed;
        shard.remapped_total += forwarded.remapped;
        shard.restart_remapped_total += forwarded.restart_remapped;
        drop(locked);
        self.settle(bound, forwarded.charged);

        let count = forwarded.members.len();
        let mut registration =
            self.register(at, forwarded.members, None, forwarded.awaited, config);
        registration.count = count;
        Decision::Admitted {
            registration,
            routes: forwarded.routes,
        }
    }

    /// Room in the byte budget for the most the requests can cost, reserved
    /// before the lock is taken (making room may take other shards' locks);
    /// what they really cost is settled once they are in. `None`: no room.
    fn reserve_for(
        &self,
        session_len: usize,
        probes: &[Probe<'_>],
        config: &Config,
    ) -> Option<usize> {
        let bound = session::session_cost(session_len)
            + probes
                .iter()
                .map(|probe| {
                    session::key_cost(probe.key.len())
                        + entries::entry_cost_bound(probe.raw.len())
                            .max(budget::waiter(probe.raw.len()))
                })
                .sum::<usize>();
        self.make_room(bound, config.max_table_bytes)
            .then_some(bound)
    }

    /// The registration of a lone request that waits in the queue for its
    /// id: awaited as going with its own id until its turn says otherwise.
    fn queued(
        self: &Arc<Self>,
        at: SessionRef,
        key_hash: u64,
        ticket: Arc<Waiter>,
        config: &Config,
    ) -> Decision {
        self.queued_total.fetch_add(1, Ordering::Relaxed);
        let mut awaited = Awaited::default();
        awaited.add((key_hash, false));
        let queued = Some((key_hash, Arc::clone(&ticket)));
        let mut registration = self.register(at, InlineVec::default(), queued, awaited, config);
        registration.count = 1;
        Decision::Queued {
            registration,
            ticket,
        }
    }

    /// Counts a POST's requests as refused.
    fn refuse(&self, requests: usize, decision: Decision) -> Decision {
        self.rejected_total
            .fetch_add(requests as u64, Ordering::Relaxed);
        decision
    }

    /// Enters each request of a POST that goes to the server into its
    /// session, with its own id or a server-side one.
    fn enter(
        &self,
        session: &[u8],
        probes: &[Probe<'_>],
        entry: &mut Session,
        next_serial: &mut u64,
        tally: Tally<'_>,
    ) -> Forwarded {
        let Tally {
            mut charged,
            unseen,
            config,
        } = tally;
        let mut forwarded = Forwarded {
            members: InlineVec::with_capacity(probes.len()),
            routes: InlineVec::with_capacity(probes.len()),
            awaited: Awaited::default(),
            charged: 0,
            passed: 0,
            remapped: 0,
            restart_remapped: 0,
        };
        for probe in probes {
            let serial = ShardState::serial(next_serial);
            let duplicate = probe.colliding;
            let remap_anyway =
                duplicate || probe.abandoned || is_reserved(&probe.key) || config.rewrite_all_ids;
            let remap = remap_anyway || unseen;
            let state = KeyState::get_or_insert(&mut entry.keys, probe, &mut charged);
            let server_id = if remap {
                forwarded.remapped += 1;
                if !remap_anyway {
                    forwarded.restart_remapped += 1;
                }
                let server_id = self.mint(session, probe.raw);
                forwarded.routes.push(Route::Remapped {
                    server_id: Arc::clone(&server_id),
                    duplicate,
                });
                ServerId::Minted(server_id)
            } else {
                forwarded.passed += 1;
                forwarded.routes.push(Route::AsIs);
                ServerId::own(probe.raw, state.key.as_bytes())
            };
            charged += entries::entry_cost(&server_id);
            state.entries.push(Entry {
                serial,
                server_id,
                cancelled: false,
                ended: false,
                at_server: true,
                removed: false,
                stream: None,
            });
            forwarded.members.push(Member {
                key_hash: probe.hash,
                serial,
            });
            forwarded.awaited.add((probe.hash, remap));
        }
        forwarded.charged = charged;
        forwarded
    }
}

/// Puts a lone request in line behind the live request with its id; says
/// what the ticket costs.
fn enqueue(
    entry: &mut Session,
    probe: &Probe<'_>,
    config: &Config,
    unseen: bool,
) -> (Arc<Waiter>, usize) {
    let ticket = Arc::new(Waiter {
        raw_id: probe.raw.into(),
        always_remap: config.rewrite_all_ids || is_reserved(&probe.key) || unseen,
        state: Mutex::new(WaitState::Waiting(None)),
    });
    let mut charged = budget::waiter(probe.raw.len());
    KeyState::get_or_insert(&mut entry.keys, probe, &mut charged)
        .waiters
        .push_back(Arc::clone(&ticket));
    (ticket, charged)
}

/// What entering a POST's requests needs besides the session.
struct Tally<'a> {
    /// Bytes charged so far (a new session's own cost).
    charged: usize,
    /// The session started before this table saw it (restart window).
    unseen: bool,
    config: &'a Config,
}

/// The requests of a POST entered into their session.
struct Forwarded {
    members: InlineVec<Member>,
    routes: InlineVec<Route>,
    awaited: Awaited,
    charged: usize,
    passed: u64,
    remapped: u64,
    restart_remapped: u64,
}

/// Marks each probe that collides: with a live request of the session with
/// the same id (see `KeyState::is_taken`), or with an earlier request of the
/// same batch. Every decision is taken against the state before this POST.
fn mark_collisions(existing: Option<&Session>, probes: &mut [Probe<'_>], any_live_collides: bool) {
    // The batch's keys seen so far, by position: looking back at every
    // earlier request would cost time in the square of a batch's size. A
    // lone request needs none (and allocates nothing).
    let mut seen: HashTable<usize> = HashTable::new();
    let probes_len = probes.len();
    for index in 0..probes_len {
        let (earlier, rest) = probes.split_at_mut(index);
        let probe = &rest[0];
        let state = existing.and_then(|entry| entry.keys.find(probe.hash, |state| state.is(probe)));
        let repeated = probes_len > 1
            && match seen.entry(
                probe.hash,
                |&other| earlier[other].same_key(probe),
                |&other| earlier[other].hash,
            ) {
                Slot::Occupied(_) => true,
                Slot::Vacant(vacant) => {
                    vacant.insert(index);
                    false
                }
            };
        let colliding = state.is_some_and(|state| state.is_taken(any_live_collides)) || repeated;
        let abandoned = state.is_some_and(KeyState::has_abandoned);
        rest[0].colliding = colliding;
        rest[0].abandoned = abandoned;
    }
}
