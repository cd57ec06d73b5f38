//! The registration of one POST's requests: moved from the response future
//! into the response body, it releases them exactly once, however the
//! exchange ends, and frees an id only once the server has answered it.

use std::cell::OnceCell;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use std::time::Instant;

use super::awaited::Awaited;
use super::budget::{self, Eviction};
use super::inline::InlineVec;
use super::queue::{WaitState, Waiter};
use super::session::Session;
use super::{
    shard_index, Abandoned, SessionRef, SessionTag, ShardState, StreamTag, Table, MAX_ABANDONED,
};
use crate::wire::restore::Delivered;

/// The longest an abandoned id is remembered: a century is "for as long as
/// the process lives", and every platform's `Instant` can add it.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// When an id abandoned `now` expires. A TTL past what the clock can add
/// (the binary takes `--abandoned-id-ttl` up to `u64::MAX` seconds) means
/// "remember it": it must never come out as "forget it at once".
pub(super) fn expiry(now: Instant, ttl: Duration) -> Instant {
    let mut ttl = ttl.min(FOREVER);
    loop {
        match now.checked_add(ttl) {
            Some(expires) => return expires,
            None => ttl /= 2,
        }
    }
}

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
/// dropped, inner error, panic unwinding) drops it.
///
/// A request's id is free again when it is released only if its response
/// passed to the client ([`note_answered`](Self::note_answered)), or if it
/// never reached the server ([`unsent`](Self::unsent)). Any other end
/// (the stream closed before the response, an error, the client gone, a
/// stand-in answer after the request was sent) leaves an id the server
/// knows as the client's own abandoned for `abandoned_id_ttl`: the server
/// may still be running it (see the [module docs](super) for why).
#[derive(Debug)]
pub(crate) struct Registration {
    pub(super) table: Arc<Table>,
    pub(super) session: SessionRef,
    /// Forwarded requests.
    pub(super) members: InlineVec<Member>,
    /// A queued request: its key's hash and its ticket (granted or not).
    pub(super) queued: Option<(u64, Arc<Waiter>)>,
    /// The responses still to pass, by the collision key of the client's id
    /// and whether it comes back restored.
    pub(super) awaited: Awaited,
    pub(super) count: usize,
    /// The requests may have reached the server.
    pub(super) sent: bool,
    pub(super) abandoned_id_ttl: Duration,
    /// The last event id the client saw on the request's own stream.
    pub(super) stream: Option<StreamTag>,
}

impl Registration {
    pub(crate) fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// Records that the request, queued until now, goes to the inner service,
    /// with a server-side id (`remapped`) or its own.
    pub(crate) fn forwarded(&mut self, remapped: bool) {
        self.table.mark_forwarded(self);
        if let Some((key_hash, _)) = &self.queued {
            self.awaited.set_restored(*key_hash, remapped);
        }
    }

    /// Crosses off responses that passed to the client; returns whether any
    /// is still awaited. Answers it did not wait for (a server that answers
    /// twice, or answers another POST's request here) change nothing.
    pub(crate) fn note_answered(&mut self, answers: impl IntoIterator<Item = Delivered>) -> bool {
        for (key, restored) in answers {
            let key_hash = self.table.hasher.hash_one(key.as_bytes());
            self.awaited.remove(&(key_hash, restored));
        }
        !self.awaited.is_empty()
    }

    /// The client saw `event_id` as the last event id of the request's own
    /// stream: a `GET` resuming from it is the one stream whose answers may
    /// free the requests if this stream ends before them.
    pub(crate) fn note_stream(&mut self, event_id: &[u8]) {
        self.stream = Some(self.table.stream_tag(event_id));
    }

    /// How many requests the POST carried.
    pub(crate) fn requests(&self) -> usize {
        self.count
    }

    /// Whether a response is still awaited.
    pub(crate) fn awaits_any(&self) -> bool {
        !self.awaited.is_empty()
    }

    /// Releases the requests as never sent: the server cannot be running
    /// them, so their ids are free at once.
    pub(crate) fn unsent(mut self) {
        self.sent = false;
    }

    /// Releases the requests as answered, every one of them (for the table's
    /// own tests, which drive no response body).
    #[cfg(test)]
    pub(crate) fn complete(mut self) {
        self.awaited.clear();
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.table.release(self);
        tracing::debug!(
            session = %SessionTag::of_hash(self.session.hash),
            requests = self.count,
            unanswered = self.awaits_any(),
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
        // A request whose response did not pass may still be running at the
        // server (a cancelled one too: a handler may ignore the
        // cancellation); keep its id abandoned for a while. The clock is read
        // only if an id is kept, and then once.
        let keep_until = OnceCell::new();
        let keep_until = || {
            *keep_until.get_or_init(|| {
                (!registration.abandoned_id_ttl.is_zero())
                    .then(|| expiry(self.now(), registration.abandoned_id_ttl))
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
                registration,
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
    /// knows it by the client's own id and may still be running it (it was
    /// handed to the server and its response did not pass), keeps it as
    /// abandoned until `keep_until()` (returned). Passes the id on to the
    /// next waiter. Adds the change in bytes to `delta`.
    fn end_entry(
        &self,
        serials: &mut u64,
        session: &mut Session,
        member: Member,
        registration: &Registration,
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
        if let Some(position) = state.entries.find(serial) {
            let entry = state.entries.get(position);
            // A remapped request's id is unique: whatever the server still
            // does with it reaches no other request. An answer that passed
            // on a resume of the stream this exchange ended at answered it.
            let answered_on_resume = entry.stream.is_some() && entry.stream == registration.stream;
            let may_still_answer = registration.sent
                && entry.at_server
                && !entry.remapped()
                && !answered_on_resume
                && registration.awaited.awaits_own(member.key_hash);
            match may_still_answer.then(&keep_until).flatten() {
                Some(expires) => {
                    state.entries.mark_ended(position, registration.stream);
                    self.abandoned.fetch_add(1, Ordering::Relaxed);
                    *delta += budget::ABANDONED as isize;
                    kept = Some(expires);
                }
                None => *delta -= state.entries.remove(position) as isize,
            }
            self.grant_waiters(serials, session.id.as_bytes(), state, delta);
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
                let position = state.entries.find(serial)?;
                state.entries.mark_at_server(position);
                Some(())
            });
        debug_assert!(entry.is_some(), "a granted request holds its entry");
    }
}
