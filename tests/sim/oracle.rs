//! What every run must satisfy, recorded by the actors as it happens and
//! checked at the end.
//!
//! - no client receives an answer to a request it did not send (its own id
//!   and its own payload marker);
//! - the server never runs two requests under one `(session, id)`;
//! - every request ends, answered or with a clean JSON-RPC error carrying
//!   its id (or, in the seeds that have one, the `408` of the timeout inside
//!   the guard), within the client's bound;
//! - once traffic has stopped and the abandoned-id TTL has passed, the
//!   guard's table holds nothing (under a TTL of `u64::MAX` s: nothing in
//!   flight);
//! - liveness: an id whose answer reached its client is free again, not
//!   abandoned for the TTL: the next request that reuses it, alone in its
//!   session, reaches the server under it (see [`Oracle::expect_free`]).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// How a client's request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Its own result.
    Answered,
    /// A JSON-RPC error carrying its id, with this HTTP status.
    Error(u16),
    /// The client cancelled it (and stopped waiting).
    Cancelled,
    /// Another conversation's `notifications/cancelled` for the same id
    /// cancelled it on the server (a cancellation of `id: 1` is ambiguous
    /// when every call is `id: 1`): its stream ended without an answer.
    CancelledByAnother,
    /// The client dropped the connection before the answer.
    Disconnected,
    /// The server had forgotten the session (it restarted): `404`.
    SessionLost,
    /// The connection broke under a fault (a held link, a restart).
    Broken,
    /// The timeout inside the guard answered `408` in the server's place
    /// (the server runs on: the guard must keep its id).
    TimedOut,
    /// A stream closed for polling, resumed with `GET` + `Last-Event-ID`,
    /// whose replay carried its own result.
    Resumed,
}

#[derive(Default)]
struct Record {
    trace: bool,
    /// Every event with its simulated time, hashed: two runs of one seed
    /// must tell the same story.
    story: std::collections::hash_map::DefaultHasher,
    violations: Vec<String>,
    outcomes: BTreeMap<Outcome, u64>,
    /// Requests the simulated server started.
    started: u64,
    /// Their markers.
    started_markers: std::collections::BTreeSet<String>,
    /// The markers of the requests the server cancelled.
    cancelled: std::collections::BTreeSet<String>,
    /// How many times the guard's host started (a restart empties its
    /// table and remaps unseen sessions for its window).
    guard_starts: u32,
    /// The server-side ids the server runs requests under now, by session:
    /// what a server that echoes ids (a progress token, a log line) leaks.
    leaked: BTreeMap<String, Vec<serde_json::Value>>,
    /// The requests that must reach the server under the client's own id,
    /// why, and the guard's starts when that was known.
    free: BTreeMap<String, (String, u32)>,
}

/// The run's record, shared by every actor (turmoil runs them all on one
/// thread, in an order the seed decides).
#[derive(Clone)]
pub struct Oracle(Arc<Mutex<Record>>);

impl Oracle {
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(Record {
            trace: std::env::var_os("SIM_TRACE").is_some(),
            ..Record::default()
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn tell(record: &mut Record, event: &str) {
        let at = turmoil::sim_elapsed().unwrap_or_default();
        at.hash(&mut record.story);
        event.hash(&mut record.story);
        if record.trace {
            eprintln!("{:>10.3} s  {event}", at.as_secs_f64());
        }
    }

    /// Something worth telling happened (`SIM_TRACE=1` prints it).
    pub fn note(&self, event: &str) {
        self.with(|record| Self::tell(record, event));
    }

    /// A property failed.
    pub fn violation(&self, what: String) {
        self.with(|record| {
            Self::tell(record, &format!("VIOLATION {what}"));
            record.violations.push(what);
        });
    }

    /// `marker`'s request ended so.
    pub fn ended(&self, marker: &str, outcome: Outcome) {
        self.with(|record| {
            Self::tell(record, &format!("{marker} ended: {outcome:?}"));
            *record.outcomes.entry(outcome).or_default() += 1;
        });
    }

    /// The server started `marker`'s request under `id` (the guard's to
    /// choose, from a random point: not part of the story).
    pub fn server_started(&self, marker: &str, id: &serde_json::Value) {
        self.with(|record| {
            Self::tell(record, &format!("{marker} started on the server"));
            record.started += 1;
            record.started_markers.insert(marker.to_owned());
            if let Some((why, starts)) = record.free.remove(marker) {
                // A guard restarted since has an empty table and remaps the
                // sessions it did not see start, for its window.
                if *id != serde_json::json!(1) && starts == record.guard_starts {
                    let what = format!(
                        "{marker} reached the server as {id}, not 1: {why} (an id abandoned for the TTL, not freed)"
                    );
                    Self::tell(record, &format!("VIOLATION {what}"));
                    record.violations.push(what);
                }
            }
        });
    }

    /// `marker`'s request carries the client's `id: 1` in a session where
    /// no other request has it (`why` says what freed it last): the guard
    /// has nothing to remap it past, so it must reach the server as `1`,
    /// unless the guard has restarted since it had started `starts` times
    /// (before the session began: [`Oracle::guard_starts`]).
    pub fn expect_free(&self, marker: &str, why: String, starts: u32) {
        self.with(|record| {
            Self::tell(record, &format!("{marker} must reach the server as 1"));
            record.free.insert(marker.to_owned(), (why, starts));
        });
    }

    /// The server runs a request under `id` in `session` (`running`), or
    /// no longer does; a server-side id is leaked meanwhile.
    pub fn leak(&self, session: &str, id: &serde_json::Value, running: bool) {
        if !id
            .as_str()
            .is_some_and(|id| id.starts_with("mcp-id-guard:"))
        {
            return;
        }
        self.with(|record| {
            let ids = record.leaked.entry(session.to_owned()).or_default();
            if running {
                ids.push(id.clone());
            } else if let Some(at) = ids.iter().position(|leaked| leaked == id) {
                ids.remove(at);
            }
        });
    }

    /// A server-side id the server runs a request of `session` under now.
    pub fn leaked(&self, session: &str) -> Option<serde_json::Value> {
        self.with(|record| record.leaked.get(session)?.first().cloned())
    }

    /// The guard's host (re)started.
    pub fn guard_started(&self) {
        self.with(|record| record.guard_starts += 1);
    }

    /// How many times the guard's host has started so far.
    pub fn guard_starts(&self) -> u32 {
        self.with(|record| record.guard_starts)
    }

    /// The server cancelled `marker`'s request.
    pub fn server_cancelled(&self, marker: &str) {
        self.with(|record| {
            Self::tell(record, &format!("{marker} cancelled on the server"));
            record.cancelled.insert(marker.to_owned());
        });
    }

    /// Whether the server started `marker`'s request.
    pub fn was_started(&self, marker: &str) -> bool {
        self.with(|record| record.started_markers.contains(marker))
    }

    /// Whether the server cancelled `marker`'s request.
    pub fn was_cancelled(&self, marker: &str) -> bool {
        self.with(|record| record.cancelled.contains(marker))
    }

    /// The hash of every event and its simulated time.
    pub fn story(&self) -> u64 {
        self.with(|record| record.story.finish())
    }

    pub fn violations(&self) -> Vec<String> {
        self.with(|record| record.violations.clone())
    }

    pub fn outcomes(&self) -> BTreeMap<Outcome, u64> {
        self.with(|record| record.outcomes.clone())
    }

    pub fn requests_started(&self) -> u64 {
        self.with(|record| record.started)
    }
}
