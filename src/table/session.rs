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
use super::SessionRef;

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

/// The requests of one session that share an id, with its collision key.
pub(super) fn key_cost(key_len: usize) -> usize {
    slot(size_of::<KeyState>()) + heap(key_len, INLINE_KEY)
}
