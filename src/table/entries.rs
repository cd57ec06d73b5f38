//! The forwarded requests of one session that share a client id, kept so
//! that every lookup costs the same however many there are: a batch may
//! carry one id 100 000 times (each but the first remapped), and each of
//! those requests is found, ended and removed on its own.

use super::examined;
use super::inline::InlineVec;
use std::mem::size_of;
use std::sync::Arc;

use super::budget::ARC_HEADER;
use super::StreamTag;

/// Entries oldest first, and so by serial (serials only grow), which finds
/// one by binary search. A removed entry leaves a hole, until holes are half
/// of the list: then the list is compacted, which amortises to O(1) per
/// removal (an entry removed from the middle would otherwise shift all
/// those after it). The last entry is never a hole. Counts kept on the way
/// answer the collision predicates without a scan.
#[derive(Debug, Default)]
pub(super) struct Entries {
    list: InlineVec<Entry>,
    holes: usize,
    /// Entries the client still waits for ([`Entry::is_live`]).
    live: usize,
    /// No live entry sits before this position.
    first_live: usize,
    /// The entry the server knows by the client's own id. There is at most
    /// one: a request goes with its own id only while no entry of the id is
    /// live under it or abandoned (see `KeyState::is_taken` and
    /// `KeyState::has_abandoned`), and every other entry is remapped.
    own: Option<Own>,
}

#[derive(Debug, Clone, Copy)]
struct Own {
    serial: u64,
    live: bool,
}

impl Entries {
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(super) fn push(&mut self, entry: Entry) {
        debug_assert!(
            self.list
                .last()
                .is_none_or(|last| last.serial < entry.serial),
            "serials only grow"
        );
        if !entry.remapped() {
            debug_assert!(self.own.is_none(), "one own-id entry at most");
            self.own = Some(Own {
                serial: entry.serial,
                live: entry.is_live(),
            });
        }
        if entry.is_live() {
            self.live += 1;
        }
        self.list.push(entry);
    }

    /// The position of the entry `serial`, if present.
    pub(super) fn find(&self, serial: u64) -> Option<usize> {
        let position = self
            .list
            .binary_search_by(|entry| {
                examined::one();
                entry.serial.cmp(&serial)
            })
            .ok()?;
        (!self.list[position].removed).then_some(position)
    }

    pub(super) fn get(&self, position: usize) -> &Entry {
        &self.list[position]
    }

    /// The entry the server knows by the client's own id.
    pub(super) fn own(&self) -> Option<usize> {
        self.find(self.own?.serial)
    }

    /// The oldest live entry the server has.
    pub(super) fn oldest_live_at_server(&mut self) -> Option<usize> {
        while self
            .list
            .get(self.first_live)
            .is_some_and(|entry| entry.removed || !entry.is_live())
        {
            examined::one();
            self.first_live += 1;
        }
        // Past the cursor, at most one live entry is not at the server yet:
        // a queued request is granted the id only while no entry is live.
        let rest = self.list.get(self.first_live..)?;
        examined::each(rest.iter())
            .position(|entry| !entry.removed && entry.is_live() && entry.at_server)
            .map(|offset| self.first_live + offset)
    }

    pub(super) fn mark_at_server(&mut self, position: usize) {
        self.list[position].at_server = true;
    }

    /// A `notifications/cancelled` named the entry.
    pub(super) fn mark_cancelled(&mut self, position: usize) {
        self.update(position, |entry| entry.cancelled = true);
    }

    /// The entry's exchange ended before its response; `stream` tags the
    /// last event id its client saw on the request's own stream, if any.
    pub(super) fn mark_ended(&mut self, position: usize, stream: Option<StreamTag>) {
        self.update(position, |entry| {
            entry.ended = true;
            entry.stream = stream;
        });
    }

    fn update(&mut self, position: usize, change: impl FnOnce(&mut Entry)) {
        let entry = &mut self.list[position];
        let was_live = entry.is_live();
        change(entry);
        if was_live && !entry.is_live() {
            self.live -= 1;
            if let Some(own) = self.own.as_mut().filter(|own| own.serial == entry.serial) {
                own.live = false;
            }
        }
    }

    /// The live entry's answer passed on a `GET` that resumed the stream
    /// `resumed` before its own exchange ended.
    pub(super) fn mark_answered_on(&mut self, position: usize, resumed: StreamTag) {
        self.list[position].stream = Some(resumed);
    }

    /// Removes the entry; returns the bytes that frees.
    pub(super) fn remove(&mut self, position: usize) -> usize {
        let entry = &mut self.list[position];
        let freed = entry_cost(&entry.server_id);
        if entry.is_live() {
            self.live -= 1;
        }
        if self.own.is_some_and(|own| own.serial == entry.serial) {
            self.own = None;
        }
        // A hole keeps its serial for the binary search, nothing else.
        entry.removed = true;
        entry.server_id = ServerId::Bare;
        self.holes += 1;
        while self.list.last().is_some_and(|last| last.removed) {
            self.list.remove(self.list.len() - 1);
            self.holes -= 1;
        }
        if self.holes * 2 > self.list.len() {
            self.list.retain(|entry| {
                examined::one();
                !entry.removed
            });
            self.holes = 0;
            self.first_live = 0;
        }
        self.first_live = self.first_live.min(self.list.len());
        freed
    }

    /// Whether a live entry blocks a new request with the id: any live one
    /// when `any_live`, else only the one known by the client's own id.
    pub(super) fn blocks(&self, any_live: bool) -> bool {
        if any_live {
            self.live > 0
        } else {
            self.own.is_some_and(|own| own.live)
        }
    }

    /// Whether the server may still answer an entry under the client's own
    /// id that the client no longer waits for ([`Entry::is_abandoned`]).
    pub(super) fn has_abandoned(&self) -> bool {
        self.own.is_some_and(|own| !own.live)
    }
}

/// One forwarded request.
#[derive(Debug)]
pub(super) struct Entry {
    /// Unique within the shard: a guard finds its entries by it.
    pub(super) serial: u64,
    /// The id the inner server knows the request by.
    pub(super) server_id: ServerId,
    /// A `notifications/cancelled` named it.
    pub(super) cancelled: bool,
    /// Its exchange ended before the response did; kept only while the
    /// server may still answer it.
    pub(super) ended: bool,
    /// The request has been handed to the inner service. A queued request
    /// holds its entry from the moment its turn comes until its future
    /// forwards it; a cancellation must not name it before the server has it.
    pub(super) at_server: bool,
    /// Removed: a hole in [`Entries`], kept only for its serial.
    pub(super) removed: bool,
    /// Once ended: the last event id its client saw on the request's own
    /// stream. A `GET` resuming the stream from there (`Last-Event-ID`) is
    /// the only other stream whose answer frees the entry. While live: the
    /// stream a `GET` resumed when the answer passed on it (it frees the
    /// entry if the request's own stream ends at that very event id).
    pub(super) stream: Option<StreamTag>,
}

impl Entry {
    /// The server id was minted by a guard (else it is the client's own id).
    pub(super) fn remapped(&self) -> bool {
        matches!(self.server_id, ServerId::Minted(_))
    }

    /// The client still waits for it.
    pub(super) fn is_live(&self) -> bool {
        !self.cancelled && !self.ended
    }

    /// The server may still answer it under the client's own id, though the
    /// client no longer waits for that answer.
    pub(super) fn is_abandoned(&self) -> bool {
        !self.remapped() && !self.is_live()
    }
}

/// The JSON text of the id the inner server knows a request by.
///
/// Only a cancellation needs the text of a client's own id, and that text is
/// nearly always the collision key itself (a number) or the key in quotes (a
/// string without escapes): it is rebuilt from the key then rather than
/// copied for every request.
#[derive(Debug)]
pub(super) enum ServerId {
    /// The client's id, written exactly as its key.
    Bare,
    /// The client's id, written as its key in double quotes.
    Quoted,
    /// The client's id, written some other way (escapes, `-0`, ...).
    Verbatim(Arc<[u8]>),
    /// A server-side id minted by a guard.
    Minted(Arc<[u8]>),
}

impl ServerId {
    /// The client's own id `raw`, whose collision key is `key`.
    pub(super) fn own(raw: &str, key: &[u8]) -> Self {
        let raw = raw.as_bytes();
        if raw == key {
            Self::Bare
        } else if raw.len() == key.len() + 2
            && raw.first() == Some(&b'"')
            && raw.last() == Some(&b'"')
            && &raw[1..raw.len() - 1] == key
        {
            // Escapes would make the text differ from the decoded key.
            Self::Quoted
        } else {
            Self::Verbatim(Arc::from(raw))
        }
    }

    /// The JSON text, given the collision key of the entry.
    pub(super) fn text(&self, key: &[u8]) -> Arc<[u8]> {
        match self {
            Self::Bare => Arc::from(key),
            Self::Quoted => {
                let mut text = Vec::with_capacity(key.len() + 2);
                text.push(b'"');
                text.extend_from_slice(key);
                text.push(b'"');
                Arc::from(text)
            }
            Self::Verbatim(text) | Self::Minted(text) => Arc::clone(text),
        }
    }
}

// What an entry costs, for the byte budget (see `budget`).

/// One forwarded request (the first of a key sits inline in its
/// [`KeyState`], the others in a vector: one size fits both).
pub(super) fn entry_cost(server_id: &ServerId) -> usize {
    size_of::<Entry>()
        + match server_id {
            ServerId::Bare | ServerId::Quoted => 0,
            ServerId::Verbatim(text) | ServerId::Minted(text) => ARC_HEADER + text.len(),
        }
}

/// What [`entry_cost`] will charge at most for a request whose id is `raw_len`
/// bytes of JSON text: a minted id holds the original (escaped, so at most
/// twice as long) after a short prefix.
pub(super) fn entry_cost_bound(raw_len: usize) -> usize {
    size_of::<Entry>() + ARC_HEADER + 2 * raw_len + 96
}
