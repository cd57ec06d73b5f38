//! What the restorer holds back: a message's id token and what follows it,
//! until the message shows what it is (see the parent module's docs).

use bytes::BytesMut;
use smallvec::SmallVec;

use crate::wire::id::INLINE_ID_KEY;

/// How much the restorer holds after an id while it waits to learn whether
/// the message is a response (the keys and scalars between the id and the
/// next envelope key), and whether a response carries a second `id` key (its
/// payload). Past it, a message not known as a response goes on as the
/// server wrote it, a response goes on restored.
pub(super) const WINDOW: usize = 64 * 1024;

/// An id held back, with what follows it so far.
#[derive(Debug)]
pub(super) struct Held {
    /// Absolute offset of the id's first byte.
    pub(super) start: usize,
    /// The id token's length, once it ended.
    pub(super) id_len: Option<usize>,
    /// The message is a response, to restore at its end unless a second
    /// `id` or a string `method` shows up within the window.
    pub(super) response: bool,
    pub(super) bytes: Kept,
}

/// What is held from the id on: every byte when the restorer restores (they
/// go on split around the id, without a copy), only the id when it watches
/// (nothing goes on from it), inline when short: a watched answer then costs
/// no allocation.
#[derive(Debug)]
pub(super) enum Kept {
    All(BytesMut),
    Id(SmallVec<[u8; INLINE_ID_KEY]>),
}

/// The bytes a restoring hold starts with room for (see [`Kept::new`]).
const HELD_START: usize = 256;

impl Kept {
    pub(super) fn new(restoring: bool) -> Self {
        if restoring {
            // Room for a server-side id and the keys after it up to the
            // answer's value, so the usual held token is not grown twice.
            Self::All(BytesMut::with_capacity(HELD_START))
        } else {
            Self::Id(SmallVec::new())
        }
    }

    pub(super) fn extend_from_slice(&mut self, bytes: &[u8]) {
        match self {
            Self::All(all) => all.extend_from_slice(bytes),
            Self::Id(id) => id.extend_from_slice(bytes),
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::All(all) => all,
            Self::Id(id) => id,
        }
    }
}

impl Held {
    /// Absolute offset past which a key no longer changes what is done with
    /// the id: the end of the window after it.
    pub(super) fn window_end(&self) -> Option<usize> {
        Some(self.start + self.id_len? + WINDOW)
    }

    /// The id token, if it ended within `max_id` bytes.
    pub(super) fn id(&self, max_id: usize) -> Option<&str> {
        let id_len = self.id_len?;
        if id_len > max_id {
            return None;
        }
        std::str::from_utf8(&self.bytes.as_bytes()[..id_len]).ok()
    }
}
