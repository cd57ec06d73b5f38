//! One session's state: its requests by client id, and the predicates that
//! decide when a new request collides with them.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use hashbrown::HashTable;

use std::mem::size_of;

use super::budget::{heap, slot};
use super::entries::Entries;
use super::examined;
use super::inline::{SessionId, StoredKey, INLINE_KEY, INLINE_SESSION_ID};
use super::queue::Waiter;
use super::{SessionRef, StreamTag};

/// One session's requests.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) hash: u64,
    pub(super) serial: u64,
    pub(super) id: SessionId,
    /// Entries and waiters by the collision key of the client's id.
    pub(super) keys: HashTable<KeyState>,
    /// Requests of the session whose exchange has not ended, queued and
    /// cancelled ones included: what the per-session cap counts.
    pub(super) in_flight: usize,
    /// Where resumed streams of the session went on from; made at the first
    /// resumption that goes on, so sessions that never resume cost nothing.
    pub(super) resumptions: Option<Box<Resumptions>>,
}

/// How many resumptions a session remembers: a client that polls
/// (SEP-1699) resumes one stream at a time, from the last event id it saw.
const RESUMPTIONS: usize = 4;

/// Where the streams of a session that were resumed went on from: a later
/// last event id, seen on a resumed `GET`, and the stream it continues (the
/// one a request's own POST ended at). A server that closes resumed streams
/// too has the client resume again from the last event id it saw there, and
/// an answer on that resumption is still the answer to the request whose
/// stream it continues. Fixed in size (the oldest link is replaced first),
/// so a client cannot grow it, and charged to the byte budget
/// ([`resumptions_cost`]).
#[derive(Debug, Default)]
pub(super) struct Resumptions {
    links: [Option<(StreamTag, StreamTag)>; RESUMPTIONS],
    next: usize,
}

impl Resumptions {
    /// The stream a resumption from `at` continues: the origin of a known
    /// link, else `at` itself.
    pub(super) fn origin(&self, at: StreamTag) -> StreamTag {
        self.links
            .iter()
            .flatten()
            .find(|(later, _)| *later == at)
            .map_or(at, |(_, origin)| *origin)
    }

    /// A resumption of `origin` reached the event whose tag is `at`.
    pub(super) fn link(&mut self, at: StreamTag, origin: StreamTag) {
        if at == origin {
            return;
        }
        if let Some(link) = self
            .links
            .iter_mut()
            .flatten()
            .find(|(later, _)| *later == at)
        {
            link.1 = origin;
            return;
        }
        self.links[self.next] = Some((at, origin));
        self.next = (self.next + 1) % RESUMPTIONS;
    }
}

impl Session {
    /// The hash is compared first: a mismatch then costs no byte compare.
    pub(super) fn is(&self, hash: u64, id: &[u8]) -> bool {
        self.hash == hash && self.id.as_bytes() == id
    }

    pub(super) fn is_empty(&self) -> bool {
        self.in_flight == 0 && self.keys.is_empty()
    }

    pub(super) fn find(sessions: &mut HashTable<Session>, at: SessionRef) -> Option<&mut Session> {
        sessions.find_mut(at.hash, |session| session.serial == at.serial)
    }
}

/// The requests of one session that share a client id.
#[derive(Debug)]
pub(super) struct KeyState {
    pub(super) hash: u64,
    pub(super) key: StoredKey,
    /// Forwarded requests, oldest first.
    pub(super) entries: Entries,
    /// Requests waiting for the id under [`OnDuplicate::Queue`], first come
    /// first served.
    pub(super) waiters: VecDeque<Arc<Waiter>>,
}

impl KeyState {
    pub(super) fn new(probe: &Probe<'_>) -> Self {
        Self {
            hash: probe.hash,
            key: StoredKey::new(probe.key.as_bytes()),
            entries: Entries::default(),
            waiters: VecDeque::new(),
        }
    }

    /// The hash is compared first: it is in the slot.
    pub(super) fn is(&self, probe: &Probe<'_>) -> bool {
        examined::one();
        self.hash == probe.hash && self.key.as_bytes() == probe.key.as_bytes()
    }

    /// Whether it holds the entry `serial` (serials are unique in a shard:
    /// this tells keys apart whose hashes are equal).
    pub(super) fn holds(&self, hash: u64, serial: u64) -> bool {
        self.hash == hash && self.entries.find(serial).is_some()
    }

    /// Whether a new request with this id is a duplicate for the policy, or
    /// others already wait for it.
    ///
    /// Under `Remap` only a live request the server knows by the client's own
    /// id counts: the newcomer is remapped, later ones too, and the first to
    /// arrive after that request ended goes as-is again. Under `Reject` and
    /// `Queue`, and whenever every id is rewritten, any live request of the
    /// client with this id counts, remapped or not (a request remapped past a
    /// abandoned id is still in flight under the client's id).
    pub(super) fn is_taken(&self, any_live: bool) -> bool {
        !self.waiters.is_empty() || self.blocks(any_live)
    }

    pub(super) fn blocks(&self, any_live: bool) -> bool {
        self.entries.blocks(any_live)
    }

    /// Whether a new request with this id must go with a server-side id.
    pub(super) fn has_abandoned(&self) -> bool {
        self.entries.has_abandoned()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.waiters.is_empty()
    }

    /// The key's state in `keys`, created empty if need be (adding its cost
    /// to `charged`).
    pub(super) fn get_or_insert<'k>(
        keys: &'k mut HashTable<KeyState>,
        probe: &Probe<'_>,
        charged: &mut usize,
    ) -> &'k mut Self {
        keys.entry(probe.hash, |state| state.is(probe), |state| state.hash)
            .or_insert_with(|| {
                *charged += key_cost(probe.key.len());
                KeyState::new(probe)
            })
            .into_mut()
    }

    /// What removing this (empty) key's state frees.
    pub(super) fn cost(&self) -> usize {
        key_cost(self.key.as_bytes().len())
    }
}

/// One request id of a POST, hashed once before the lock is taken.
#[derive(Debug)]
pub(super) struct Probe<'a> {
    /// The id's JSON text.
    pub(super) raw: &'a str,
    /// Its collision key.
    pub(super) key: Cow<'a, str>,
    /// The hash of the key.
    pub(super) hash: u64,
    /// It collides with a request in flight, or an earlier one of its batch.
    pub(super) colliding: bool,
    /// Its id is abandoned by an earlier request (see [`Entry::is_abandoned`]).
    pub(super) abandoned: bool,
}

impl Probe<'_> {
    pub(super) fn same_key(&self, other: &Probe<'_>) -> bool {
        examined::one();
        self.hash == other.hash && self.key == other.key
    }
}

impl Session {
    /// Takes a waiter out of line; returns the bytes that frees.
    pub(super) fn remove_waiter(&mut self, key_hash: u64, ticket: &Arc<Waiter>) -> usize {
        let found = self.keys.find_entry(key_hash, |state| {
            state.hash == key_hash
                && state
                    .waiters
                    .iter()
                    .any(|waiter| Arc::ptr_eq(waiter, ticket))
        });
        let Ok(mut slot) = found else {
            return 0;
        };
        let state = slot.get_mut();
        state.waiters.retain(|waiter| !Arc::ptr_eq(waiter, ticket));
        let mut freed = super::budget::waiter(ticket.raw_id.len());
        if state.is_empty() {
            freed += state.cost();
            slot.remove();
        }
        freed
    }
}

// What the items of a session cost, for the byte budget (see `budget`).

/// A session, with its id.
pub(super) fn session_cost(id_len: usize) -> usize {
    slot(size_of::<Session>()) + heap(id_len, INLINE_SESSION_ID)
}

/// A session's resumption links, on the heap.
pub(super) const fn resumptions_cost() -> usize {
    size_of::<Resumptions>() + 2 * size_of::<usize>()
}

/// The requests of one session that share an id, with its collision key.
pub(super) fn key_cost(key_len: usize) -> usize {
    slot(size_of::<KeyState>()) + heap(key_len, INLINE_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(value: u64) -> StreamTag {
        StreamTag(std::num::NonZeroU64::new(value).unwrap())
    }

    #[test]
    fn resumptions_follow_a_stream_and_keep_the_last_four() {
        let mut resumptions = Resumptions::default();
        assert_eq!(resumptions.origin(tag(1)), tag(1), "unknown: itself");
        resumptions.link(tag(2), tag(1));
        resumptions.link(tag(3), resumptions.origin(tag(2)));
        assert_eq!(resumptions.origin(tag(3)), tag(1), "a second resumption");
        resumptions.link(tag(1), tag(1));
        assert_eq!(resumptions.origin(tag(1)), tag(1), "no link to itself");
        for later in 10..14 {
            resumptions.link(tag(later), tag(9));
        }
        assert_eq!(resumptions.origin(tag(2)), tag(2), "the oldest went first");
        assert_eq!(resumptions.origin(tag(13)), tag(9));
        resumptions.link(tag(13), tag(5));
        assert_eq!(resumptions.origin(tag(13)), tag(5), "relinked in place");
        assert_eq!(resumptions.origin(tag(10)), tag(9));
    }
}
