//! How the simulated clients read a response: as WHATWG clients do (SSE
//! events once their blank line has come, a leading byte order mark
//! skipped), each byte within a read timeout.

use std::time::Duration;

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use crate::respond::BOM;
use crate::upstream::UNKNOWN_SESSION;

/// What a response carried.
#[derive(Default)]
pub struct Read {
    /// The JSON-RPC response in it, if any.
    pub answer: Option<Value>,
    /// The last SSE event id it carried.
    pub last_event: Option<String>,
    /// The first SSE event id it carried.
    pub first_event: Option<String>,
    /// The start of the body, for the record.
    pub text: String,
    /// The server said it does not know the session.
    pub unknown_session: bool,
    /// The body was cut, not ended.
    pub cut: bool,
    /// The ids of the server's requests it carried (sampling).
    pub asked: Vec<Value>,
}

/// How long a client waits for the next byte of a response (its head, or
/// the next frame) before it gives up and drops the connection: a read
/// timeout, past every timeout of the guard's (the proxy's 30 s, a link
/// held 20 s on the way). A connection cut by a partition between the
/// client and the guard stalls for good (turmoil loses what was sent
/// meanwhile), and only this ends it.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// `what`, unless it is silent for [`READ_TIMEOUT`].
pub async fn within_read_timeout<T>(
    what: impl std::future::Future<Output = T>,
) -> Result<T, Box<dyn std::error::Error>> {
    tokio::time::timeout(READ_TIMEOUT, what)
        .await
        .map_err(|_| format!("read timeout: nothing for {READ_TIMEOUT:?}").into())
}

/// Reads a response to its end (or its cut): its answer and last event id.
pub async fn read(
    response: impl std::future::Future<Output = Result<Response<Incoming>, Box<dyn std::error::Error>>>,
) -> Result<(StatusCode, Read), Box<dyn std::error::Error>> {
    let response = within_read_timeout(response).await??;
    let status = response.status();
    let sse = response
        .headers()
        .get("content-type")
        .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
    let unknown_session = response.headers().contains_key(UNKNOWN_SESSION);
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    // A cut stream keeps what arrived before the cut.
    let mut cut = false;
    while let Some(frame) = within_read_timeout(body.frame()).await? {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            Err(_) => {
                cut = true;
                break;
            }
        }
    }
    let mut read = Read {
        text: String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned(),
        unknown_session: unknown_session && status == StatusCode::NOT_FOUND,
        cut,
        ..Read::default()
    };
    if sse {
        for (id, message) in sse_events(&bytes) {
            if id.is_some() {
                if read.first_event.is_none() {
                    read.first_event.clone_from(&id);
                }
                read.last_event = id;
            }
            if message.get("method").is_some() && message.get("id").is_some() {
                read.asked.push(message["id"].clone());
            } else if message.get("result").is_some() || message.get("error").is_some() {
                read.answer = Some(message);
            }
        }
    } else {
        // As `fetch`'s `json()` does, a leading byte order mark is skipped.
        read.answer = serde_json::from_slice(bytes.strip_prefix(BOM).unwrap_or(&bytes)).ok();
    }
    Ok((status, read))
}

/// Each SSE event's id and the JSON message of its data (events without
/// data, such as the priming event, count for their id). A byte order mark
/// leading the stream is no part of the first field (the SSE standard's
/// decoder drops it). As in a WHATWG client, an event counts once its blank
/// line has come: the tail of a stream cut inside an event sets no last
/// event id (resuming from it would skip the event).
fn sse_events(body: &[u8]) -> Vec<(Option<String>, Value)> {
    let text = String::from_utf8_lossy(body.strip_prefix(BOM).unwrap_or(body));
    let mut events: Vec<&str> = text.split("\n\n").collect();
    // What follows the last blank line: an event not dispatched (or "").
    events.pop();
    events
        .into_iter()
        .map(|event| {
            let id = event
                .lines()
                .find_map(|line| line.strip_prefix("id:"))
                .map(|id| id.trim().to_owned());
            let data: Vec<&str> = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            let message = serde_json::from_str(&data.join("\n")).unwrap_or(Value::Null);
            (id, message)
        })
        .collect()
}
