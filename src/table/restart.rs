//! The restart window: after the guard starts, requests of sessions it did
//! not see start go with server-side ids.

use std::hash::BuildHasher;
use std::sync::atomic::Ordering;

use hashbrown::hash_table::Entry as Slot;

use super::{budget, Table, SHARDS};
use crate::table::config::Config;

impl Table {
    /// Whether the restart window is still open; the first call after it
    /// ended frees the sessions seen starting.
    pub(super) fn restart_window_open(&self, config: &Config) -> bool {
        if !self.restarting.load(Ordering::SeqCst) {
            return false;
        }
        if self.now().saturating_duration_since(self.created) < config.restart_window {
            return true;
        }
        if self.restarting.swap(false, Ordering::SeqCst) {
            for index in 0..SHARDS {
                let started = std::mem::take(&mut self.lock(index).started);
                self.apply(-((started.len() * budget::STARTED) as isize));
            }
        }
        false
    }

    /// Whether the guard should watch for sessions starting: the restart
    /// window is open.
    pub(crate) fn watches_starts(&self, config: &Config) -> bool {
        self.restart_window_open(config)
    }

    /// Records that the server started `session` (the `Mcp-Session-Id` of an
    /// answer to `initialize`): during the restart window its requests need
    /// no server-side ids. Not recorded when the id is too long, the window
    /// has ended, or the budget has no room (the session's requests are then
    /// remapped for the window, which is always safe).
    pub(crate) fn note_started(&self, session: &[u8], config: &Config) {
        if session.len() > config.max_session_id_bytes || !self.restart_window_open(config) {
            return;
        }
        if !self.reserve(budget::STARTED, config.max_table_bytes) {
            tracing::debug!("table full: a session start is not recorded");
            return;
        }
        let hash = self.hasher.hash_one(session);
        let mut shard = self.shard(hash);
        // Checked under the lock: the window's end clears each shard after
        // it is marked closed, so nothing is added behind it.
        let open = self.restarting.load(Ordering::SeqCst);
        let inserted = open
            && matches!(
                shard
                    .started
                    .entry(hash, |seen| *seen == hash, |seen| *seen),
                Slot::Vacant(_)
            );
        if inserted {
            shard.started.insert_unique(hash, hash, |seen| *seen);
        }
        drop(shard);
        if !inserted {
            self.apply(-(budget::STARTED as isize));
        }
    }
}
