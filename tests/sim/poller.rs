//! The sequential poller (#42, repeated resumption): one client with a
//! session of its own, whose calls run one after another, each `id: 1`. The
//! server closes every stream of its calls early, resumed ones too (SEP-1699
//! polling), and sends progress meanwhile, so the client resumes again and
//! again from the last event id of the latest resumed stream, and the
//! answer comes on some resumption of a resumption.
//!
//! The liveness oracle: alone in its session, a call that follows one whose
//! answer reached the client must reach the server as `1`. The guard must
//! have freed the id on whichever resumption carried the answer (the resume
//! tie follows the stream), not left it abandoned for the TTL, where the
//! next call would be remapped past it. A call that ended without its answer
//! (a fault) rightly leaves the id abandoned: the poller starts a new
//! session then, which holds no abandoned id. A guard restart voids the
//! claim (see [`Oracle::expect_free`]).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::client::{call, initialize, Plan};
use crate::oracle::Oracle;
use crate::world::{Quirks, Setup};

/// The poller's host name.
pub const NAME: &str = "poller";

/// How many calls the poller makes, one after another.
const CALLS: usize = 8;

/// Whether the server closes every stream of the call with this payload
/// marker (the poller's).
pub fn is_polled(marker: &str) -> bool {
    marker.starts_with("poller/")
}

/// Runs the poller's calls; returns every session it used.
pub async fn run(
    setup: Setup,
    quirks: Quirks,
    seed: u64,
    oracle: Oracle,
) -> turmoil::Result<Vec<String>> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Its calls hide no header: a refusal would end a call unanswered.
    let quirks = Quirks {
        hiding: false,
        ..quirks
    };
    // The guard's starts before the session began: a restart since voids
    // the claim (the new guard did not see the session start).
    let mut starts = oracle.guard_starts();
    let mut session = initialize(NAME, &setup, &oracle).await?;
    let mut sessions = vec![session.clone()];
    // What freed `id: 1` in the session last; `None` once a call ended
    // without its answer reaching the client (the id stays abandoned).
    let mut freed = Some("a new session".to_owned());
    for index in 0..CALLS {
        let marker = format!("poller/call-{index}");
        let why = match freed.take() {
            Some(why) => why,
            None => {
                // A new session: one with an abandoned id tells nothing.
                starts = oracle.guard_starts();
                session = initialize(NAME, &setup, &oracle).await?;
                sessions.push(session.clone());
                "a new session".to_owned()
            }
        };
        oracle.expect_free(&marker, why, starts);
        // Long enough for a few resumptions (one every 0.5 s or so).
        let ms = rng.random_range(1_000..=4_000);
        let called = call(&setup, &quirks, &session, &marker, ms, Plan::Wait, &oracle).await;
        freed = match called.answered {
            Some(0) => Some(format!("{marker} was answered on its POST's stream")),
            Some(polls) => Some(format!("{marker} was answered on resumption {polls}")),
            None => None,
        };
        if called.session_lost {
            freed = None;
        }
        let think = rng.random_range(0..1_000);
        tokio::time::sleep(Duration::from_millis(think)).await;
    }
    Ok(sessions)
}
