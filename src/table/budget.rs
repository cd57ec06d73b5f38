//! What the table's contents cost, for the byte budget
//! (`IdGuardLayer::max_table_bytes`).
//!
//! Each item is charged when it enters the table and refunded when it
//! leaves, with the same function of its (fixed) sizes, so the sum never
//! drifts. The estimates cover the item's inline size, its share of the hash
//! table or queue slot that holds it, and what it keeps on the heap: a session
//! id or collision key too long to sit inline, a server-side id. They leave
//! out what does not grow with what clients send (the shards, the spare
//! session of each shard, the capacity a table keeps after it shrank).

use std::mem::size_of;
use std::time::Instant;

use super::inline::{INLINE_KEY, INLINE_SESSION_ID};
use super::queue::Waiter;
use super::session::{Entry, KeyState, ServerId, Session};
use super::Abandoned;

/// A hash table keeps between 7/16 and 7/8 of its slots full, plus one
/// control byte per slot: an item costs about 1.5 times its size on average.
const fn slot(size: usize) -> usize {
    (size + 1) * 3 / 2
}

/// What an `Arc<[u8]>` or `Arc<T>` adds on the heap: its two counters.
const ARC_HEADER: usize = 2 * size_of::<usize>();

/// A session, with its id.
pub(super) fn session(id_len: usize) -> usize {
    slot(size_of::<Session>()) + heap(id_len, INLINE_SESSION_ID)
}

/// The requests of one session that share an id, with its collision key.
pub(super) fn key(key_len: usize) -> usize {
    slot(size_of::<KeyState>()) + heap(key_len, INLINE_KEY)
}

/// One forwarded request (the first of a key sits inline in its
/// [`KeyState`], the others in a vector: one size fits both).
pub(super) fn entry(server_id: &ServerId) -> usize {
    size_of::<Entry>()
        + match server_id {
            ServerId::Bare | ServerId::Quoted => 0,
            ServerId::Verbatim(text) | ServerId::Minted(text) => ARC_HEADER + text.len(),
        }
}

/// What [`entry`] will charge at most for a request whose id is `raw_len`
/// bytes of JSON text: a minted id holds the original (escaped, so at most
/// twice as long) after a short prefix.
pub(super) fn entry_bound(raw_len: usize) -> usize {
    size_of::<Entry>() + ARC_HEADER + 2 * raw_len + 96
}

/// A queued request, with its id text.
pub(super) fn waiter(raw_len: usize) -> usize {
    ARC_HEADER + size_of::<Waiter>() + raw_len + 2 * size_of::<usize>()
}

/// An abandoned id's expiry record, in its shard's queue and in the table's
/// eviction order.
pub(super) const ABANDONED: usize = (size_of::<Abandoned>() + size_of::<Eviction>()) * 3 / 2;

/// A session seen starting during the restart window (its hash).
pub(super) const STARTED: usize = slot(size_of::<u64>());

fn heap(len: usize, inline: usize) -> usize {
    if len > inline {
        len
    } else {
        0
    }
}

/// An abandoned id in the table-wide order in which they are forgotten under
/// pressure: its shard, whose own queue holds the record (shards keep their
/// abandoned ids in the same order).
#[derive(Debug, Clone, Copy)]
pub(super) struct Eviction {
    pub(super) expires: Instant,
    pub(super) shard: usize,
}
