//! Not public API: entry points into the guard's building blocks for the
//! crate's own benchmarks and fuzz targets. No stability promise.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use crate::guard::IdGuardLayer;
use crate::table::config::Config;
use crate::table::Table;
use crate::wire::edit::splice;
use crate::wire::envelope::{peek, Kind, Peeked};
use crate::wire::id::IdMinter;
use crate::wire::restore::restore_whole;

/// Rewrites the id of every request in a JSON-RPC body (single or batch) to a
/// freshly minted server-side id, as remapping does. `None` when the body is
/// not JSON-RPC or has no request.
pub fn remap_request_ids(minter: &Minter, body: &[u8]) -> Option<Vec<u8>> {
    let peeked = peek(body)?;
    let edits: Vec<_> = peeked
        .request_ids(body)
        .map(|(range, raw)| (range, Arc::from(minter.0.mint(raw))))
        .collect();
    (!edits.is_empty()).then(|| splice(body, &edits))
}

/// Restores client ids in a JSON-RPC response body (single or batch), as the
/// response path does. `None` when there was nothing to restore.
pub fn restore_response_ids(body: &[u8]) -> Option<Vec<u8>> {
    restore_whole(body)
}

/// One message as the guard's envelope peeker reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadMessage {
    /// `"request"`, `"notification"`, `"response"` or `"other"`.
    pub kind: &'static str,
    /// The byte range of the top-level `id` (absent or `null`: `None`).
    pub id: Option<Range<usize>>,
    /// For `notifications/cancelled`, the byte range of `params.requestId`.
    pub cancels: Option<Range<usize>>,
}

/// How the guard reads a body: `None` when it does not read it as JSON-RPC,
/// else whether it is a batch and its messages. `from_server`: the body is
/// the inner server's (responses), else a client's (requests).
pub fn read_body(body: &[u8], from_server: bool) -> Option<(bool, Vec<ReadMessage>)> {
    // Both sides are read alike now; the flag stays for the fuzz oracle.
    let _ = from_server;
    let peeked = peek(body)?;
    let messages = peeked
        .messages()
        .iter()
        .map(|message| ReadMessage {
            kind: match message.kind {
                Kind::Request => "request",
                Kind::Notification => "notification",
                Kind::Response => "response",
                Kind::Other => "other",
            },
            id: message.id.clone(),
            cancels: message.cancels.clone(),
        })
        .collect();
    Some((matches!(peeked, Peeked::Batch(_)), messages))
}

/// A server-side id minter (one per guard instance in the real layer).
#[derive(Debug)]
pub struct Minter(IdMinter);

impl Default for Minter {
    fn default() -> Self {
        Self(IdMinter::new())
    }
}

impl Minter {
    /// The JSON text of a fresh server-side id carrying `original`.
    pub fn mint(&self, original: &str) -> Vec<u8> {
        self.0.mint(original)
    }
}

/// The incremental SSE rewriter used on `text/event-stream` responses.
#[derive(Debug, Default)]
pub struct SseRewriter(crate::wire::sse::Rewriter);

impl SseRewriter {
    /// Feeds one chunk; returns the bytes that can go on (joined into one
    /// buffer here; the real body passes them on piece by piece).
    pub fn push(&mut self, chunk: Bytes) -> Option<Bytes> {
        let mut out = std::collections::VecDeque::new();
        self.0.push(chunk, &mut out);
        joined(out)
    }

    /// Feeds one chunk; appends the pieces that can go on to `out`, as the
    /// real response body passes them on (one frame each, uncopied).
    pub fn push_pieces(&mut self, chunk: Bytes, out: &mut std::collections::VecDeque<Bytes>) {
        self.0.push(chunk, out);
    }

    /// Ends the stream; appends whatever was held back to `out`.
    pub fn finish_pieces(&mut self, out: &mut std::collections::VecDeque<Bytes>) {
        self.0.finish(out);
    }

    /// Ends the stream; returns whatever was held back.
    pub fn finish(&mut self) -> Option<Bytes> {
        let mut out = std::collections::VecDeque::new();
        self.0.finish(&mut out);
        joined(out)
    }
}

/// The pieces as one buffer: the only piece itself when there is one.
fn joined(mut out: std::collections::VecDeque<Bytes>) -> Option<Bytes> {
    match out.len() {
        0 => None,
        1 => out.pop_front(),
        _ => Some(Bytes::from(
            out.iter()
                .flat_map(|piece| piece.iter().copied())
                .collect::<Vec<u8>>(),
        )),
    }
}

/// How a tracked POST ends, for [`BatchTracker::track`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// Every response passed to the client.
    Answered,
    /// The responses of the first half passed, then the exchange ended.
    HalfAnswered,
    /// The exchange ended before any response (the client went away).
    Dropped,
    /// Each request was named by a `notifications/cancelled`, then the
    /// exchange ended before any response.
    Cancelled,
}

/// A layer's session table, driven directly: admits one POST's request ids
/// and ends the exchange, as the service does, without HTTP around it.
#[derive(Debug)]
pub struct BatchTracker {
    config: Config,
    table: Arc<Table>,
}

impl BatchTracker {
    /// The table of `layer`, with its settings.
    pub fn new(layer: &IdGuardLayer) -> Self {
        let (config, table) = layer.parts();
        Self { config, table }
    }

    /// Admits `ids` (JSON texts) as one POST of `session` and ends it as `end`
    /// says; returns how many requests were admitted (0 when refused).
    pub fn track(&self, session: &[u8], ids: &[&str], end: BatchEnd) -> usize {
        let answered = match end {
            BatchEnd::Answered => ids.len(),
            BatchEnd::HalfAnswered => ids.len() / 2,
            BatchEnd::Dropped | BatchEnd::Cancelled => 0,
        };
        self.table.track(
            session,
            ids,
            answered,
            end == BatchEnd::Cancelled,
            &self.config,
        )
    }
}
