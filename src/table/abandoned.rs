//! Abandoned ids: expiring them when their time is up, and forgetting the
//! oldest first when the byte budget is full.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, TryLockError};
use std::time::Instant;

use super::budget::{self, Eviction};
use super::session::resumptions_cost;
use super::{Abandoned, Log, Resumed, ShardState, StreamTag, Table, SHARDS};

/// A set of shards, one bit each; iterating empties it.
#[derive(Debug, Default)]
struct ShardSet(u64);

const _: () = assert!(
    SHARDS <= u64::BITS as usize,
    "a shard set has one bit per shard"
);

impl ShardSet {
    fn insert(&mut self, index: usize) {
        self.0 |= 1 << index;
    }

    fn contains(&self, index: usize) -> bool {
        self.0 & (1 << index) != 0
    }

    fn is_empty(&self) -> bool {
        self.0 == 0
    }
}

impl Iterator for ShardSet {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let index = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(index)
    }
}

impl Table {
    /// Drops abandoned ids whose time is up, and sessions left empty.
    /// Amortised O(1): expiries are in order. Reads the clock only when the
    /// shard has abandoned ids at all.
    pub(super) fn expire_abandoned(&self, shard: &mut ShardState) {
        if shard.abandoned.is_empty() {
            return;
        }
        let now = self.now();
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
    pub(super) fn drop_abandoned(
        &self,
        shard: &mut ShardState,
        record: &Abandoned,
        delta: &mut isize,
    ) {
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
                .find(record.serial)
                .filter(|&position| state.entries.get(position).ended);
            if let Some(position) = position {
                *delta -= state.entries.remove(position) as isize;
                self.abandoned.fetch_sub(1, Ordering::Relaxed);
                self.grant_waiters(&mut shard.next_serial, session.id.as_bytes(), state, delta);
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
    ///
    /// An expired record is the table's only pointer to a shard that may
    /// have seen no request since: dropped alone, that shard would keep its
    /// expired ids' bytes charged with nothing left to make it give them
    /// back, and the budget would refuse requests of every other shard. So a
    /// record of another shard is dropped only once that shard has expired
    /// its ids; that shard is only tried (`try_lock`), never waited for,
    /// since the caller holds its own shard and a wait could close a cycle.
    /// When it is busy, the record stays for the next call or
    /// [`evict_oldest`](Self::evict_oldest). A record of the caller's own
    /// shard can go: the record pushed now points at that shard and outlives
    /// it.
    pub(super) fn push_eviction(&self, eviction: Eviction) {
        let mut order = self.evictions();
        let now = self.now();
        let mut expired = ShardSet::default();
        while let Some(index) = next_expired(&order, now) {
            if index != eviction.shard && !expired.contains(index) {
                let Some(mut shard) = self.try_lock(index) else {
                    break;
                };
                self.expire_abandoned(&mut shard);
                expired.insert(index);
            }
            order.pop_front();
        }
        order.push_back(eviction);
    }

    /// The table's eviction records, oldest first.
    fn evictions(&self) -> MutexGuard<'_, VecDeque<Eviction>> {
        self.evictions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The shard `index` if no one holds it.
    fn try_lock(&self, index: usize) -> Option<MutexGuard<'_, ShardState>> {
        match self.shards[index].0.try_lock() {
            Ok(shard) => Some(shard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Makes room: gives back the bytes of the ids whose time is up, if the
    /// oldest records say there are some, else forgets the oldest abandoned
    /// id of the table, before its time. Returns `false` when neither is
    /// left. Takes no lock while holding another.
    pub(super) fn evict_oldest(&self) -> bool {
        loop {
            let (expired, victim) = {
                let mut order = self.evictions();
                let now = self.now();
                let mut expired = ShardSet::default();
                while let Some(index) = next_expired(&order, now) {
                    expired.insert(index);
                    order.pop_front();
                }
                // Expiring may free enough: no id is forgotten early unless
                // the caller still needs room after that.
                let victim = if expired.is_empty() {
                    order.pop_front()
                } else {
                    None
                };
                (expired, victim)
            };
            if !expired.is_empty() {
                // Their shards may have seen no request since their ids
                // expired: they give the bytes back now.
                for index in expired {
                    let mut shard = self.lock(index);
                    self.expire_abandoned(&mut shard);
                }
                return true;
            }
            let Some(victim) = victim else {
                return false;
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

    pub(super) fn log_eviction(&self, evicted: u64) {
        if let Some(suppressed) = Log::Evicted.due(self) {
            tracing::warn!(
                evicted_total = evicted,
                table_bytes = self.used.load(Ordering::Relaxed),
                "table full: forgetting the oldest abandoned ids before their time \
                 ({suppressed} more since the last such line)"
            );
        }
    }
}

/// Answers that arrive on a stream other than the request's own.
impl Table {
    /// The stream a `GET` of `session` resuming from `event_id` continues:
    /// the stream a request's own POST ended at, however many times it was
    /// resumed before (see [`Resumptions`](super::session::Resumptions)).
    pub(crate) fn resumed_stream(&self, session: &[u8], event_id: &[u8]) -> StreamTag {
        let at = self.stream_tag(event_id);
        let session_hash = self.hasher.hash_one(session);
        let locked = self.shard(session_hash);
        locked
            .sessions
            .find(session_hash, |entry| entry.is(session_hash, session))
            .and_then(|session| session.resumptions.as_deref())
            .map_or(at, |resumptions| resumptions.origin(at))
    }

    /// A `GET` of `session` that resumed a stream passed the event
    /// `event_id` to the client: a later resumption from there continues
    /// the same stream. Kept only while the session holds requests (an
    /// answer frees nothing in a session that holds none), and only if the
    /// links fit in the budget (else the id stays abandoned: when in doubt,
    /// remap).
    pub(crate) fn resumed_to(&self, session: &[u8], resumed: Resumed, event_id: &[u8]) {
        let at = self.stream_tag(event_id);
        let session_hash = self.hasher.hash_one(session);
        let mut locked = self.shard(session_hash);
        let Some(session) = locked
            .sessions
            .find_mut(session_hash, |entry| entry.is(session_hash, session))
        else {
            return;
        };
        if session.resumptions.is_none() {
            if !self.reserve(resumptions_cost(), resumed.max_table_bytes) {
                return;
            }
            session.resumptions = Some(Box::default());
        }
        if let Some(resumptions) = session.resumptions.as_deref_mut() {
            resumptions.link(at, resumed.origin);
        }
    }

    /// A response with the client's own id `key` passed to the client on a
    /// `GET` of `session` that resumed the stream `resumed` (its
    /// `Last-Event-ID`), after the server closed a request's own stream to
    /// have the client poll (SEP-1699). If the request abandoned under that
    /// id is the one whose stream this resumes, the server has now answered
    /// it: the id is free.
    ///
    /// Only an abandoned entry is freed, and only the one whose own stream
    /// ended at `resumed`: the server replays a stream's events, so an
    /// answer on a resumed stream is that stream's request's, possibly an
    /// old one (a request answered long ago whose stream the client resumes
    /// again). While an id is abandoned every new request with it goes with
    /// a server-side id, so the server runs at most one request under the
    /// client's own id.
    pub(crate) fn answered_on_resume(&self, session: &[u8], key: &[u8], resumed: StreamTag) {
        let session_hash = self.hasher.hash_one(session);
        let key_hash = self.hasher.hash_one(key);
        let mut locked = self.shard(session_hash);
        let shard = &mut *locked;
        let Ok(mut slot) = shard
            .sessions
            .find_entry(session_hash, |entry| entry.is(session_hash, session))
        else {
            return;
        };
        let session = slot.get_mut();
        let Ok(mut key_slot) = session.keys.find_entry(key_hash, |state| {
            state.hash == key_hash && state.key.as_bytes() == key
        }) else {
            return;
        };
        let state = key_slot.get_mut();
        // Only the entry known by the client's own id can be abandoned.
        let Some(position) = state.entries.own() else {
            return;
        };
        let entry = state.entries.get(position);
        if !entry.ended {
            // The resume overtook the end of the request's own exchange (a
            // proxy still holding it, a disconnect not noticed yet): the
            // answer counts once that exchange ends, if the stream it ends
            // at is the one resumed here.
            if entry.at_server {
                state.entries.mark_answered_on(position, resumed);
            }
            return;
        }
        if entry.stream != Some(resumed) {
            return;
        }
        let mut delta = -(state.entries.remove(position) as isize);
        // Its record in the shard's expiry queue stays, and gives back the
        // record's bytes when it expires (finding no entry by then).
        self.abandoned.fetch_sub(1, Ordering::Relaxed);
        self.grant_waiters(
            &mut shard.next_serial,
            session.id.as_bytes(),
            state,
            &mut delta,
        );
        if state.is_empty() {
            delta -= state.cost() as isize;
            key_slot.remove();
        }
        if session.is_empty() {
            delta += ShardState::keep_spare(&mut shard.spare, slot.remove().0);
        }
        drop(locked);
        self.apply(delta);
    }
}

/// The shard of the oldest eviction record, if its time is up.
fn next_expired(order: &VecDeque<Eviction>, now: Instant) -> Option<usize> {
    order
        .front()
        .filter(|first| first.expires <= now)
        .map(|first| first.shard)
}
