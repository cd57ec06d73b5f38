//! The registration of one POST's requests: moved from the response future
//! into the response body, it releases them exactly once, however the
//! exchange ends.

use std::sync::Arc;
use std::time::Duration;

use super::inline::InlineVec;
use super::queue::Waiter;
use super::{tag, SessionRef, Table};
use crate::id::IdKey;

/// A forwarded request of a registration: its key's hash and its entry's
/// serial, all the release needs to find the entry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) key_hash: u64,
    pub(super) serial: u64,
}

/// The registration of one POST's requests. Dropping it releases them,
/// exactly once: it lives in the response future and then in the response
/// body, so every way an exchange can end (body finished or dropped, future
/// dropped, inner error, panic unwinding) drops it. Only
/// [`complete`](Self::complete) tells the table the server has answered;
/// any other end leaves the ids abandoned for `abandoned_id_ttl`.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(super) table: Arc<Table>,
    pub(super) session: SessionRef,
    /// Forwarded requests.
    pub(super) members: InlineVec<Member>,
    /// A queued request: its key's hash and its ticket (granted or not).
    pub(super) queued: Option<(u64, Arc<Waiter>)>,
    /// The collision keys of the requests whose responses end the exchange
    /// early, or nothing when the policy does not need it.
    pub(super) awaited: Vec<IdKey>,
    pub(super) count: usize,
    pub(super) completed: bool,
    pub(super) abandoned_id_ttl: Duration,
}

impl Registration {
    /// The collision keys of the requests whose responses end the exchange
    /// early, or nothing when the policy does not need it.
    pub(crate) fn awaited_keys(&self) -> Vec<IdKey> {
        self.awaited.clone()
    }

    pub(crate) fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// Records that the request, queued until now, goes to the inner service.
    pub(crate) fn forwarded(&self) {
        self.table.mark_forwarded(self);
    }

    /// Releases the ids of an exchange that ended normally: the server has
    /// answered, so nothing is kept.
    pub(crate) fn complete(mut self) {
        self.completed = true;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.table.release(self);
        tracing::debug!(
            session = %tag(self.session.hash),
            requests = self.count,
            completed = self.completed,
            "released in-flight ids"
        );
    }
}
