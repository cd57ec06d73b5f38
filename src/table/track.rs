//! Admitting one POST and ending it as an exchange may end, in one call: for
//! the unit tests and benchmarks that keep tracking linear in a batch's size.

use std::sync::Arc;

use super::{Decision, Route, Table};
use crate::table::config::Config;
use crate::wire::id::id_key;

impl Table {
    /// Admits `ids` as one POST of `session`; cancels each of them if
    /// `cancel`, lets the responses of the first `answered` pass, and ends the
    /// exchange (the rest are abandoned or removed, as the table decides).
    /// Returns how many requests were admitted.
    pub(crate) fn track(
        self: &Arc<Self>,
        session: &[u8],
        ids: &[&str],
        answered: usize,
        cancel: bool,
        config: &Config,
    ) -> usize {
        let Decision::Admitted {
            mut registration,
            routes,
        } = self.admit(session, ids, ids.len() > 1, config)
        else {
            return 0;
        };
        if cancel {
            for raw in ids {
                self.cancel(session, raw);
            }
        }
        let answers = ids.iter().zip(routes.iter()).take(answered);
        registration.note_answered(
            answers.map(|(raw, route)| (id_key(raw), matches!(route, Route::Remapped { .. }))),
        );
        routes.len()
    }
}
