//! Fuzz checks for `mcp-id-guard`, shared by the cargo-fuzz targets in
//! `fuzz_targets/` and by the root package's `tests/guard/fuzz_regressions.rs`
//! (which includes this file with `#[path]`), so CI runs every check over
//! the committed seeds and crash inputs without a fuzzer.

pub mod input;
pub mod oracle;
pub mod request_path;
pub mod sse_rewriter;

/// Crate bugs the targets found. An input that shows one makes `check`
/// return it rather than panic with a generic message, so a run can be told
/// to go on past it (while a bug is open) or to stop on it (the fuzz targets
/// do: all four are fixed, see "Fix four bugs found by fuzzing"). Each has
/// an input under `regressions/` and a regression test in
/// `tests/guard/fuzz_regressions.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownBug {
    /// A restored original id whose JSON text holds a raw CR or LF (JSON
    /// whitespace inside a non-scalar id such as `[1,\n2]`) is spliced into
    /// an SSE `data:` line as is: the line break ends the data line, the rest
    /// of the message becomes a line with no field name, and the client's
    /// message is no longer valid JSON.
    LineBreakInRestoredSseId,
    /// A server-side id whose prefix is written with a JSON escape (for
    /// example `"\u006dcp-id-guard:..."`) is restored only when the run of
    /// events handed to the rewriter at once also holds the literal prefix,
    /// so whether it is restored depends on the chunking and on other events
    /// (the `application/json` path always restores it).
    EscapedPrefixDependsOnChunking,
    /// Under `Queue`, a cancellation that frees an id hands it to the next
    /// queued request at once, before that request reaches the inner
    /// service; a second cancellation of the same id in the same batch (or
    /// one racing the queued request's task) then names that request, and
    /// reaches the server before the request itself: the server ignores a
    /// cancellation for an id it does not know, the request then runs
    /// uncancelled, and the guard counts it cancelled (with
    /// `rewrite_all_ids`, `requestId` is even rewritten to a server-side id
    /// the server has never seen).
    CancelNamesUnforwardedRequest,
    /// Under `Queue`, a request whose client id is in the reserved namespace
    /// (`"mcp-id-guard:..."`, always to be rewritten) waits behind a live
    /// request with that id and, when its turn comes, goes to the inner
    /// service with the client's own id: the namespace's guarantee is gone,
    /// and on an event stream the guard then unwraps the client's own
    /// (forged, well-formed) id in the response, so the client receives an
    /// id it did not send.
    QueuedReservedIdForwardedAsIs,
}
