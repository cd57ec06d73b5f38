//! [`Lines`]: what a `fmt` subscriber writes, kept for a test to read.

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use mcp_id_guard::IdGuard;
use tower::ServiceExt;

use super::inner::Echo;
use super::wait::within;

/// Every line written, as text; a `fmt` layer's writer
/// (`with_writer(move || lines.clone())`).
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<u8>>>);

impl Lines {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// How many lines hold both `level` and `text`.
    pub fn matching(&self, level: &str, text: &str) -> usize {
        self.text()
            .lines()
            .filter(|line| line.contains(level) && line.contains(text))
            .count()
    }

    /// How many lines are at `level`.
    pub fn at(&self, level: &str) -> usize {
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

/// A `fmt` subscriber at `level` writing into `lines`, for this thread.
pub fn capture(lines: &Lines, level: tracing::Level) -> tracing::subscriber::DefaultGuard {
    let lines = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || lines.clone())
        .finish();
    tracing::subscriber::set_default(subscriber)
}

/// A JSON-RPC request `{"id": id, "method": method}` in `session`.
pub fn call(session: &str, id: &str, method: &str) -> Request<Full<Bytes>> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .body(Full::new(Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#
        ))))
        .unwrap()
}

/// Sends `request` through the guard around the echo and reads the whole
/// answer; its status.
pub async fn send(service: &IdGuard<Echo>, request: Request<Full<Bytes>>) -> http::StatusCode {
    let response = within(service.clone().oneshot(request)).await.unwrap();
    let status = response.status();
    within(response.into_body().collect()).await.unwrap();
    status
}
