//! The forwarded requests of one session that share a client id, kept so
//! that every lookup costs the same however many there are: a batch may
//! carry one id 100 000 times (each but the first remapped), and each of
//! those requests is found, ended and removed on its own.

use super::examined;
use super::inline::InlineVec;
use super::session::{entry_cost, Entry, ServerId};

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

    /// The entry's exchange ended before its response.
    pub(super) fn mark_ended(&mut self, position: usize) {
        self.update(position, |entry| entry.ended = true);
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
