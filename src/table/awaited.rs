//! The responses a registration still waits for: what decides, when the
//! exchange ends, whether the server has answered each request (its id is
//! free) or may still be running it (its id stays abandoned).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::inline::InlineVec;

/// What a registration keeps of an awaited response: the table's keyed hash
/// of the collision key (what its entries are found by; keeping the key
/// itself would copy every id, up to the body limit, once more per request)
/// and whether it comes back restored. The hasher's key is random per process,
/// so no client can make two of its ids meet here.
pub(super) type Awaiting = (u64, bool);

/// Past this many awaited responses a map replaces the list, so that a large
/// batch costs constant time per response, not time in its size.
const FEW: usize = 16;

/// A multiset of the responses one POST still waits for. A batch may carry
/// one id twice (the second went to the server remapped), so entries count.
#[derive(Debug, Default)]
pub(crate) enum Awaited {
    /// The usual case: one request, or a small batch.
    #[default]
    None,
    /// Inline while one: a lone request allocates nothing here.
    Few(InlineVec<Awaiting>),
    Many(HashMap<Awaiting, usize, BuildHasherDefault<Spread>>),
}

impl Awaited {
    /// Awaits one more response.
    pub(super) fn add(&mut self, answer: Awaiting) {
        match self {
            Self::None => {
                let mut list = InlineVec::default();
                list.push(answer);
                *self = Self::Few(list);
            }
            Self::Few(list) if list.len() < FEW => list.push(answer),
            Self::Few(list) => {
                let mut map = HashMap::with_capacity_and_hasher(list.len() * 2, Default::default());
                for answer in std::mem::take(list).into_iter().chain([answer]) {
                    *map.entry(answer).or_insert(0) += 1;
                }
                *self = Self::Many(map);
            }
            Self::Many(map) => *map.entry(answer).or_insert(0) += 1,
        }
    }

    /// Crosses off a response that passed; `false` when none like it was
    /// awaited (a server that answers twice, or an answer to another POST).
    pub(super) fn remove(&mut self, answer: &Awaiting) -> bool {
        match self {
            Self::None => false,
            Self::Few(list) => match list.iter().position(|awaited| awaited == answer) {
                Some(position) => {
                    list.remove(position);
                    true
                }
                None => false,
            },
            Self::Many(map) => match map.get_mut(answer) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    true
                }
                Some(_) => {
                    map.remove(answer);
                    true
                }
                None => false,
            },
        }
    }

    /// Whether a response with the client's own id, whose key hashes to
    /// `key_hash` (not restored), is still awaited.
    pub(super) fn awaits_own(&self, key_hash: u64) -> bool {
        match self {
            Self::None => false,
            Self::Few(list) => list.contains(&(key_hash, false)),
            Self::Many(map) => map.contains_key(&(key_hash, false)),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match self {
            Self::None => true,
            Self::Few(list) => list.is_empty(),
            Self::Many(map) => map.is_empty(),
        }
    }

    /// The response to a queued request now goes restored (`true`) or as it
    /// is: its turn came with a server-side id or without.
    pub(super) fn set_restored(&mut self, key_hash: u64, restored: bool) {
        if self.remove(&(key_hash, !restored)) {
            self.add((key_hash, restored));
        }
    }

    #[cfg(test)]
    pub(super) fn clear(&mut self) {
        *self = Self::None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_response_once_in_few_and_many() {
        for size in [1, FEW, FEW * 8] {
            let mut awaited = Awaited::default();
            for n in 0..size {
                awaited.add((n as u64, false));
            }
            // One id twice: the second went remapped.
            awaited.add((0, true));
            assert!(awaited.awaits_own(0));
            assert!(awaited.remove(&(0, true)));
            assert!(!awaited.remove(&(0, true)), "answered once");
            assert!(
                awaited.awaits_own(0),
                "the restored answer is not the own one"
            );
            for n in 0..size {
                assert!(awaited.remove(&(n as u64, false)));
            }
            assert!(awaited.is_empty(), "size {size}");
            assert!(!awaited.awaits_own(0));
        }
    }
}

/// The hasher of [`Awaited::Many`]: an awaited response's key is already the
/// table's keyed hash of a collision key, so it is used as it is (a second
/// hash of it would only cost time).
#[derive(Debug, Default)]
pub(crate) struct Spread(u64);

impl Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only the integers below are written; anything else still spreads.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 ^= value;
    }

    fn write_u8(&mut self, value: u8) {
        // `restored`: flips the low bits, so both kinds of one key differ.
        self.0 ^= u64::from(value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}
