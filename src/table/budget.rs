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

use super::queue::Waiter;
use super::Abandoned;

/// A hash table keeps between 7/16 and 7/8 of its slots full, plus one
/// control byte per slot: an item costs about 1.5 times its size on average.
pub(super) const fn slot(size: usize) -> usize {
    (size + 1) * 3 / 2
}

/// What an `Arc<[u8]>` or `Arc<T>` adds on the heap: its two counters.
pub(super) const ARC_HEADER: usize = 2 * size_of::<usize>();

/// A queued request, with its id text.
pub(super) fn waiter(raw_len: usize) -> usize {
    ARC_HEADER + size_of::<Waiter>() + raw_len + 2 * size_of::<usize>()
}

/// An abandoned id's expiry record, in its shard's queue and in the table's
/// eviction order.
pub(super) const ABANDONED: usize = (size_of::<Abandoned>() + size_of::<Eviction>()) * 3 / 2;

/// A session seen starting during the restart window (its hash).
pub(super) const STARTED: usize = slot(size_of::<u64>());

pub(super) fn heap(len: usize, inline: usize) -> usize {
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

use std::sync::atomic::Ordering;

impl super::Table {
    /// Reserves `bytes` of the budget `limit`, forgetting the oldest
    /// abandoned ids as long as that is needed and possible.
    pub(super) fn make_room(&self, bytes: usize, limit: usize) -> bool {
        loop {
            if self.reserve(bytes, limit) {
                return true;
            }
            if !self.evict_oldest() {
                return false;
            }
        }
    }

    pub(super) fn reserve(&self, bytes: usize, limit: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(bytes).filter(|next| *next <= limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    /// Replaces a reservation of `reserved` bytes by the `charged` ones.
    pub(super) fn settle(&self, reserved: usize, charged: usize) {
        self.apply(charged as isize - reserved as isize);
    }

    pub(super) fn apply(&self, delta: isize) {
        if delta > 0 {
            self.used.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
        } else if delta < 0 {
            self.used.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }
}
