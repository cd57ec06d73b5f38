//! Bounding waits, and checking that the guard let go of every request.

use std::future::Future;
use std::time::{Duration, Instant};

use mcp_id_guard::{IdGuardLayer, Stats};

use super::WAIT_TIMEOUT;

/// Bound of [`within`]: long enough for a loaded 2-core machine, short
/// enough that a hang fails the test rather than the CI job.
pub const WITHIN: Duration = Duration::from_secs(30);

/// Awaits `future`, failing the test if it takes longer than [`WITHIN`].
#[track_caller]
pub fn within<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let caller = std::panic::Location::caller();
    async move {
        tokio::time::timeout(WITHIN, future)
            .await
            .unwrap_or_else(|_| panic!("timed out after {WITHIN:?} at {caller}"))
    }
}

/// Nothing in flight and no session tracked.
pub fn is_drained(stats: &Stats) -> bool {
    stats.in_flight_requests == 0 && stats.in_flight_sessions == 0
}

/// Asserts that the guard holds nothing right now.
#[track_caller]
pub fn assert_drained(layer: &IdGuardLayer) {
    let stats = layer.stats();
    assert!(
        is_drained(&stats),
        "every request must be released: {stats:?}"
    );
}

/// Polls `layer.stats()` until `done` holds or `within` passes; returns the
/// last snapshot. The guard releases a request when the server side of its
/// exchange ends, which may trail what the client saw, and no event marks
/// that moment, so this polls a counter.
pub async fn stats_when(
    layer: &IdGuardLayer,
    within: Duration,
    mut done: impl FnMut(&Stats) -> bool,
) -> Stats {
    let deadline = Instant::now() + within;
    loop {
        let stats = layer.stats();
        if done(&stats) || Instant::now() >= deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (up to [`WAIT_TIMEOUT`]) until the guard holds nothing; the
/// counters, or an error naming them.
pub async fn drained(layer: &IdGuardLayer) -> anyhow::Result<Stats> {
    let stats = stats_when(layer, WAIT_TIMEOUT, is_drained).await;
    anyhow::ensure!(is_drained(&stats), "stats did not drain: {stats:?}");
    Ok(stats)
}

/// Asserts the guard lets go of every request within [`WAIT_TIMEOUT`].
#[track_caller]
pub fn assert_released(layer: &IdGuardLayer) -> impl Future<Output = Stats> + '_ {
    let caller = std::panic::Location::caller();
    async move {
        drained(layer)
            .await
            .unwrap_or_else(|error| panic!("every request must be released ({caller}): {error}"))
    }
}
