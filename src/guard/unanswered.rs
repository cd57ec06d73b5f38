//! The mark a forwarding service puts on an answer it gives in the MCP
//! server's place, so the guard knows whether the server may still be
//! running the request.

/// Marks a response that did not come from the MCP server: a forwarding
/// service between [`IdGuard`](crate::IdGuard) and the server answered in
/// its place (an upstream that could not be reached, a timeout). Put it in
/// the response's extensions.
///
/// The guard frees a request's id only when the server's response to it has
/// passed. A stand-in answer is no such response, even when it is a
/// JSON-RPC error carrying the request's id, so the guard reads this mark to
/// learn what became of the request: [`Unanswered::NotSent`] frees its ids
/// at once, [`Unanswered::Sent`] keeps the ids the server knows as the
/// client's own abandoned, because the server may still run it and answer it
/// late. [`proxy::Proxy`](crate::proxy::Proxy) marks every answer it gives
/// itself.
///
/// ```
/// use http::{Response, StatusCode};
/// use mcp_id_guard::inner::Unanswered;
///
/// // A forwarding service whose upstream timed out after the request left.
/// let mut response = Response::new(());
/// *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
/// response.extensions_mut().insert(Unanswered::Sent);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unanswered {
    /// The request never left for the server: no connection, every
    /// connection busy, refused before it was written.
    NotSent,
    /// The request may have reached the server, which may still run it.
    Sent,
}
