//! The registration of one POST's requests: moved from the response future
//! into the response body, it releases them exactly once, however the
//! exchange ends.

use std::cell::OnceCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::budget::{self, Eviction};
use super::inline::InlineVec;
use super::queue::{WaitState, Waiter};
use super::session::{self, Session};
use super::{shard_index, tag, Abandoned, SessionRef, ShardState, Table, MAX_ABANDONED};
use crate::id::IdKey;

/// A forwarded request of a registration: its key's hash and its entry's
/// serial, all the release needs to find the entry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) key_hash: u64,
    pub(super) serial: u64,
}

/// The registration of one POST's requests. Dropping it releases them,
/// exactly once: it lives in the response future and then in the response
/// body, so every way an exchange can end (body finished or dropped, future
/// dropped, inner error, panic unwinding) drops it. Only
/// [`complete`](Self::complete) tells the table the server has answered;
/// any other end leaves the ids abandoned for `abandoned_id_ttl`.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(super) table: Arc<Table>,
    pub(super) session: SessionRef,
    /// Forwarded requests.
    pub(super) members: InlineVec<Member>,
    /// A queued request: its key's hash and its ticket (granted or not).
    pub(super) queued: Option<(u64, Arc<Waiter>)>,
    /// The collision keys of the requests whose responses end the exchange
    /// early, or nothing when the policy does not need it.
    pub(super) awaited: Vec<IdKey>,
    pub(super) count: usize,
    pub(super) completed: bool,
    pub(super) abandoned_id_ttl: Duration,
}

impl Registration {
    /// The collision keys of the requests whose responses end the exchange
    /// early, or nothing when the policy does not need it.
    pub(crate) fn awaited_keys(&self) -> Vec<IdKey> {
        self.awaited.clone()
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

impl Drop for Registration {
    fn drop(&mut self) {
        self.table.release(self);
        tracing::debug!(
            session = %tag(self.session.hash),
            requests = self.count,
            completed = self.completed,
            "released in-flight ids"
        );
    }
}

/// Releasing a registration's entries (when it is dropped) and marking a
/// queued request forwarded.
impl Table {
    fn release(&self, registration: &Registration) {
        let index = shard_index(registration.session.hash);
        // Without expiring the shard's abandoned ids first (what `shard`
        // does): releasing needs none expired, and the next request of the
        // shard expires them anyway. One clock read fewer per exchange.
        let mut locked = self.lock(index);
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
                    delta -= session.remove_waiter(*key_hash, ticket) as isize;
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
                    *delta -= session::entry_cost(&entry.server_id) as isize;
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
}
