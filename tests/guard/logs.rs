//! What the guard writes to the log when a client does the same thing over
//! and over: duplicates are the normal case (a client that sends every call
//! as `id: 1`), so they are no warning, and every line a client can trigger
//! per request comes at most once per interval, with a count of the rest.

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use mcp_id_guard::{IdGuard, IdGuardLayer};
use tower::{Layer, ServiceExt};
use tracing::Level;

use crate::support::inner::{echo, Echo};
use crate::support::wait::{assert_drained, within};

/// Every line written, as text.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Lines {
    fn matching(&self, level: &str, text: &str) -> usize {
        let written = self.0.lock().unwrap();
        String::from_utf8_lossy(&written)
            .lines()
            .filter(|line| line.contains(level) && line.contains(text))
            .count()
    }

    fn at(&self, level: &str) -> usize {
        self.matching(level, "")
    }
}

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A subscriber at `INFO` writing into `lines`, for this thread (the test
/// runtime is single-threaded, so the spawned calls log here too).
fn capture(lines: &Lines) -> tracing::subscriber::DefaultGuard {
    let lines = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(Level::INFO)
        .with_ansi(false)
        .with_writer(move || lines.clone())
        .finish();
    tracing::subscriber::set_default(subscriber)
}

fn call(session: &str, id: &str, method: &str) -> Request<Full<Bytes>> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .body(Full::new(Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#
        ))))
        .unwrap()
}

async fn send(service: &IdGuard<Echo>, request: Request<Full<Bytes>>) -> http::StatusCode {
    let response = within(service.clone().oneshot(request)).await.unwrap();
    let status = response.status();
    within(response.into_body().collect()).await.unwrap();
    status
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
