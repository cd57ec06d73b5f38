//! The guard's decision events at `DEBUG` (issue 44): one line per message
//! with the method, the id and the session's tag, no layer outside needed;
//! a batch bounded. A test binary of its own: `tracing` caches whether a
//! callsite is enabled for every thread's subscriber at once, so another
//! test's `INFO` subscriber set at the same moment could hide these lines.

#[path = "support/mod.rs"]
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use mcp_id_guard::{IdGuard, IdGuardLayer};
use tower::{Layer, ServiceExt};
use tracing::Level;

use support::inner::{echo, Echo};
use support::wait::{assert_drained, within};

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

fn capture_at(lines: &Lines, level: Level) -> tracing::subscriber::DefaultGuard {
    let lines = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
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

/// At `DEBUG`, the guard says what it decided on each message, with the
/// method, the id and the session's tag, and no layer outside needed; a
/// batch writes its first 16 and a count, however many the client sent.
#[tokio::test]
async fn decisions_at_debug_name_method_id_and_session_and_a_batch_is_bounded() {
    let lines = Lines::default();
    let _capture = capture_at(&lines, Level::DEBUG);
    let layer = IdGuardLayer::new();
    let (inner, _probe) = echo();
    let service = layer.layer(inner);
    assert_eq!(send(&service, call("debug", "7", "ping")).await, 200);
    assert_eq!(
        lines.matching(
            "DEBUG",
            r#"guard decided method="ping" id=7 decision="passed" session="#
        ),
        1,
        "{}",
        String::from_utf8_lossy(&lines.0.lock().unwrap())
    );
    let batch: Vec<String> = (100..400)
        .map(|id| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#))
        .collect();
    let request = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", "debug")
        .body(Full::new(Bytes::from(format!("[{}]", batch.join(",")))))
        .unwrap();
    send(&service, request).await;
    assert_eq!(lines.matching("DEBUG", "guard decided"), 1 + 16);
    assert_eq!(lines.matching("DEBUG", "a batch of 300 messages"), 1);
    assert_drained(&layer);
}
