//! The guard's decision events at `DEBUG` (issue 44): one line per message
//! with the method, the id and the session's tag, no layer outside needed;
//! a batch bounded. A test binary of its own: `tracing` caches whether a
//! callsite is enabled for every thread's subscriber at once, so another
//! test's `INFO` subscriber set at the same moment could hide these lines.

#[path = "support/mod.rs"]
mod support;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use mcp_id_guard::IdGuardLayer;
use tower::Layer;
use tracing::Level;

use support::inner::echo;
use support::lines::{call, capture, send, Lines};
use support::wait::assert_drained;

/// At `DEBUG`, the guard says what it decided on each message, with the
/// method, the id and the session's tag, and no layer outside needed; a
/// batch writes its first 16 and a count, however many the client sent.
#[tokio::test]
async fn decisions_at_debug_name_method_id_and_session_and_a_batch_is_bounded() {
    let lines = Lines::default();
    let _capture = capture(&lines, Level::DEBUG);
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
        lines.text()
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
