//! Containers that keep their usual single element (or short bytes) inline,
//! so that the common request allocates nothing.

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

/// A sequence whose single element is stored inline. Nearly always there is
/// exactly one (a POST carries one request, an id is in flight once), and
/// that case then costs no allocation. It reads as a slice.
#[derive(Debug, Clone)]
pub(crate) enum InlineVec<T> {
    One([T; 1]),
    /// Empty, or more than one (or one left after removals).
    Many(Vec<T>),
}

impl<T> Default for InlineVec<T> {
    fn default() -> Self {
        Self::Many(Vec::new())
    }
}

impl<T> InlineVec<T> {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        // Room for one is the inline slot.
        Self::Many(if capacity > 1 {
            Vec::with_capacity(capacity)
        } else {
            Vec::new()
        })
    }

    pub(crate) fn push(&mut self, value: T) {
        match self {
            Self::Many(many) if many.is_empty() && many.capacity() == 0 => {
                *self = Self::One([value]);
            }
            Self::Many(many) => many.push(value),
            Self::One(_) => {
                let Self::One([first]) = std::mem::take(self) else {
                    unreachable!("matched One");
                };
                *self = Self::Many(vec![first, value]);
            }
        }
    }

    /// Removes the element at `index`, keeping the order of the others.
    pub(super) fn remove(&mut self, index: usize) {
        match self {
            Self::One(_) => {
                assert_eq!(index, 0, "index out of bounds");
                *self = Self::default();
            }
            Self::Many(many) => {
                many.remove(index);
            }
        }
    }

    /// Keeps only the elements `keep` says yes to, in order.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        match self {
            Self::One([one]) => {
                if !keep(one) {
                    *self = Self::default();
                }
            }
            Self::Many(many) => many.retain(keep),
        }
    }

    /// Collects `items`, keeping a single one inline.
    pub(crate) fn collect(items: impl IntoIterator<Item = T>) -> Self {
        let mut items = items.into_iter();
        let Some(first) = items.next() else {
            return Self::default();
        };
        let Some(second) = items.next() else {
            return Self::One([first]);
        };
        let mut many = vec![first, second];
        many.extend(items);
        Self::Many(many)
    }
}

impl<A, B> InlineVec<(A, B)> {
    /// Splits a sequence of pairs into two, as `Iterator::unzip`.
    pub(crate) fn unzip(self) -> (InlineVec<A>, InlineVec<B>) {
        match self {
            Self::One([(a, b)]) => (InlineVec::One([a]), InlineVec::One([b])),
            Self::Many(many) => {
                let (a, b) = many.into_iter().unzip();
                (InlineVec::Many(a), InlineVec::Many(b))
            }
        }
    }
}

impl<T> std::ops::Deref for InlineVec<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::One(one) => one,
            Self::Many(many) => many,
        }
    }
}

impl<T> std::ops::DerefMut for InlineVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Self::One(one) => one,
            Self::Many(many) => many,
        }
    }
}

impl<T> IntoIterator for InlineVec<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        let (one, many) = match self {
            Self::One([one]) => (Some(one), Vec::new()),
            Self::Many(many) => (None, many),
        };
        one.into_iter().chain(many)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushing, removing, collecting and unzipping keep every element in
    /// order, whether it is held inline or on the heap.
    #[test]
    fn inline_vec_behaves_as_a_vec() {
        for count in 0..5_usize {
            for capacity in [0, 1, 3] {
                let mut ours = InlineVec::with_capacity(capacity);
                let mut model = Vec::new();
                for n in 0..count {
                    ours.push(n);
                    model.push(n);
                    assert_eq!(&*ours, &model[..]);
                }
                for index in [count / 2, 0] {
                    if index < model.len() {
                        ours.remove(index);
                        model.remove(index);
                        assert_eq!(&*ours, &model[..]);
                    }
                }
                ours.push(9);
                model.push(9);
                assert_eq!(ours.into_iter().collect::<Vec<_>>(), model);
            }
            let pairs = (0..count).map(|n| (n, n * 10));
            let (left, right) = InlineVec::collect(pairs.clone()).unzip();
            let (want_left, want_right): (Vec<_>, Vec<_>) = pairs.unzip();
            assert_eq!((&*left, &*right), (&*want_left, &*want_right));
            assert_eq!(
                matches!(InlineVec::collect(0..count), InlineVec::One(_)),
                count == 1,
                "a single element is kept inline"
            );
        }
    }
}
