//! Requests waiting for their id under `OnDuplicate::Queue`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::session::Session;

/// A queued request's place in line.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The client's id JSON text, to mint a server-side id at grant time.
    pub(super) raw_id: Box<str>,
    /// Go with a server-side id whatever the key's state: `rewrite_all_ids`,
    /// or a client id in the reserved namespace.
    pub(super) always_remap: bool,
    pub(super) state: Mutex<WaitState>,
}

#[derive(Debug)]
pub(super) enum WaitState {
    Waiting(Option<Waker>),
    /// The id is this request's now, as this entry; `remap` is the
    /// server-side id to use, if any.
    Granted {
        serial: u64,
        remap: Option<Arc<[u8]>>,
    },
}

impl Waiter {
    pub(super) fn lock(&self) -> MutexGuard<'_, WaitState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ready with the server-side id to use (`None`: the client's own) once
    /// the request's turn has come.
    pub(crate) fn poll_turn(&self, cx: &mut Context<'_>) -> Poll<Option<Arc<[u8]>>> {
        let mut state = self.lock();
        match &mut *state {
            WaitState::Granted { remap, .. } => Poll::Ready(remap.clone()),
            WaitState::Waiting(waker) => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Takes a waiter out of line; returns the bytes that frees.
pub(super) fn remove_waiter(session: &mut Session, key_hash: u64, ticket: &Arc<Waiter>) -> usize {
    let found = session.keys.find_entry(key_hash, |state| {
        state.hash == key_hash
            && state
                .waiters
                .iter()
                .any(|waiter| Arc::ptr_eq(waiter, ticket))
    });
    let Ok(mut slot) = found else {
        return 0;
    };
    let state = slot.get_mut();
    state.waiters.retain(|waiter| !Arc::ptr_eq(waiter, ticket));
    let mut freed = super::budget::waiter(ticket.raw_id.len());
    if state.is_empty() {
        freed += state.cost();
        slot.remove();
    }
    freed
}
