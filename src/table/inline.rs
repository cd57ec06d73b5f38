//! Containers that keep their usual single element (or short bytes) inline,
//! so that the common request allocates nothing.

use std::ops::Index;

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

/// A sequence whose first element is stored inline. Nearly always there is
/// exactly one (a POST carries one request, an id is in flight once), and
/// that case then costs no allocation.
#[derive(Debug)]
pub(crate) struct InlineVec<T> {
    /// `None` only when the sequence is empty.
    pub(super) first: Option<T>,
    pub(super) rest: Vec<T>,
}

impl<T> Default for InlineVec<T> {
    fn default() -> Self {
        Self {
            first: None,
            rest: Vec::new(),
        }
    }
}

impl<T> InlineVec<T> {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            first: None,
            rest: Vec::with_capacity(capacity.saturating_sub(1)),
        }
    }

    pub(super) fn push(&mut self, value: T) {
        if self.first.is_none() {
            self.first = Some(value);
        } else {
            self.rest.push(value);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(&self.rest)
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.first.iter_mut().chain(&mut self.rest)
    }

    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        match index {
            0 => self.first.as_mut(),
            _ => self.rest.get_mut(index - 1),
        }
    }

    /// Removes the element at `index`, keeping the order of the others.
    pub(super) fn remove(&mut self, index: usize) {
        if index > 0 {
            self.rest.remove(index - 1);
        } else if self.rest.is_empty() {
            self.first = None;
        } else {
            self.first = Some(self.rest.remove(0));
        }
    }
}

impl<T> Index<usize> for InlineVec<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        match (index, &self.first) {
            (0, Some(first)) => first,
            _ => &self.rest[index - 1],
        }
    }
}

impl<T> IntoIterator for InlineVec<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}
