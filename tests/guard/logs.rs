//! What the guard writes to the log when a client does the same thing over
//! and over: duplicates are the normal case (a client that sends every call
//! as `id: 1`), so they are no warning, and every line a client can trigger
//! per request comes at most once per interval, with a count of the rest.

use mcp_id_guard::IdGuardLayer;
use tower::Layer;
use tracing::Level;

use crate::support::inner::echo;
use crate::support::lines::{self, call, send, Lines};
use crate::support::wait::{assert_drained, within};

fn capture(lines: &Lines) -> tracing::subscriber::DefaultGuard {
    lines::capture(lines, Level::INFO)
}

/// The seed's burst (12 calls with `id: 1` in flight in one session at
/// once): eleven remapped, no warning, one `INFO` line. Before, eleven
/// `WARN` lines.
#[tokio::test]
async fn a_burst_of_duplicates_writes_no_warning() {
    let lines = Lines::default();
    let _capture = capture(&lines);
    let layer = IdGuardLayer::new();
    let (inner, mut probe) = echo();
    let service = layer.layer(inner);
    let mut calls = Vec::new();
    for _ in 0..12 {
        let service = service.clone();
        calls.push(tokio::spawn(async move {
            send(&service, call("burst", "1", "hold")).await
        }));
        probe.entered().await;
    }
    probe.release(12);
    for call in calls {
        assert_eq!(within(call).await.unwrap(), 200);
    }
    assert_eq!(layer.stats().remapped_total, 11);
    assert_eq!(lines.at("WARN"), 0, "no warning for the normal case");
    assert_eq!(lines.matching("INFO", "already in flight"), 1);
    assert_drained(&layer);
}

/// Refusals a client can cause on every request (a session at its in-flight
/// limit, a session id over the limit): one `WARN` line each per interval,
/// however many requests. Before, one per request.
#[tokio::test]
async fn refusals_a_client_repeats_are_logged_once_per_interval() {
    let lines = Lines::default();
    let _capture = capture(&lines);
    let layer = IdGuardLayer::new()
        .max_in_flight_per_session(1)
        .max_session_id_bytes(8);
    let (inner, mut probe) = echo();
    let service = layer.layer(inner);
    let held = tokio::spawn({
        let service = service.clone();
        async move { send(&service, call("full", "1", "hold")).await }
    });
    probe.entered().await;
    for id in 2..12 {
        assert_eq!(
            send(&service, call("full", &id.to_string(), "ping")).await,
            429
        );
        assert_eq!(
            send(
                &service,
                call("a-session-id-too-long", &id.to_string(), "ping")
            )
            .await,
            400
        );
    }
    probe.release(1);
    assert_eq!(within(held).await.unwrap(), 200);
    assert_eq!(lines.matching("WARN", "in-flight limit"), 1);
    assert_eq!(lines.matching("WARN", "session id too long"), 1);
    assert_eq!(lines.at("WARN"), 2);
    assert_drained(&layer);
}
