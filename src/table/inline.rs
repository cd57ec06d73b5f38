//! Containers that keep their usual single element (or short bytes) inline,
//! so that the common request allocates nothing. A sequence is `smallvec`'s
//! (as on the response path); the bytes are written here, as `smallvec`'s
//! would cost every stored key and session id a capacity word.

use smallvec::SmallVec;

/// Collision keys up to this many bytes are stored inline in their slot.
pub(super) const INLINE_KEY: usize = 22;

/// Session ids up to this many bytes (a UUID is 36) are stored inline in
/// their slot.
pub(super) const INLINE_SESSION_ID: usize = 48;

// `InlineBytes` records the length in a byte.
const _: () = assert!(INLINE_KEY <= 255 && INLINE_SESSION_ID <= 255);

/// Bytes stored inline when at most `N` long, on the heap otherwise. Nearly
/// all collision keys are short numbers or strings and nearly all session ids
/// UUID-sized: inline they cost no allocation, and comparing one reads no
/// memory beyond the slot that holds it (with 10 000 sessions, every pointer
/// followed is a likely cache miss).
#[derive(Debug)]
pub(super) enum InlineBytes<const N: usize> {
    Inline { len: u8, bytes: [u8; N] },
    Heap(Box<[u8]>),
}

/// A collision key.
pub(super) type StoredKey = InlineBytes<INLINE_KEY>;

/// A raw session id.
pub(super) type SessionId = InlineBytes<INLINE_SESSION_ID>;

impl<const N: usize> InlineBytes<N> {
    pub(super) fn new(value: &[u8]) -> Self {
        if value.len() <= N {
            let mut bytes = [0; N];
            bytes[..value.len()].copy_from_slice(value);
            Self::Inline {
                // N is at most 255 (checked where the sizes are defined).
                len: value.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(value.into())
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }
}

/// A sequence whose single element is stored inline: nearly always there
/// is exactly one (a POST carries one request, an id is in flight once), and
/// that case then costs no allocation. It reads as a slice.
pub(crate) type InlineVec<T> = SmallVec<[T; 1]>;

/// Splits a sequence of pairs into two, as `Iterator::unzip`, each kept
/// inline when it holds one.
pub(crate) fn unzip<A, B>(pairs: InlineVec<(A, B)>) -> (InlineVec<A>, InlineVec<B>) {
    let mut left = InlineVec::with_capacity(pairs.len());
    let mut right = InlineVec::with_capacity(pairs.len());
    for (a, b) in pairs {
        left.push(a);
        right.push(b);
    }
    (left, right)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unzipping keeps every pair's halves in order, and one pair inline.
    #[test]
    fn unzip_keeps_order_and_one_inline() {
        for count in 0..5_usize {
            let pairs = (0..count).map(|n| (n, n * 10));
            let (left, right) = unzip(pairs.clone().collect());
            let (want_left, want_right): (Vec<_>, Vec<_>) = pairs.unzip();
            assert_eq!((&*left, &*right), (&*want_left, &*want_right));
            assert_eq!(!left.spilled() && !right.spilled(), count <= 1);
        }
    }
}
