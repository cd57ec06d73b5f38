//! What the guard did with each JSON-RPC message of a POST, for the layers
//! outside it: a layer puts [`WantsExchange`] in the request's extensions,
//! and the guard puts an [`Exchange`] (one [`Handled`] per message: its
//! [`McpMethod`] and its [`GuardDecision`]) in the response's.
//!
//! [`MetricsLayer`](crate::protect::metrics::MetricsLayer) counts requests
//! by method and decision from it, and the trace layer (feature `otel`)
//! makes its spans from it; a layer of your own can read it the same way.
//! Without a `WantsExchange` on the request the guard leaves nothing, so a
//! guard with no such layer outside it costs no extension per request.
//!
//! ```
//! use mcp_id_guard::exchange::{Exchange, GuardDecision, McpMethod, WantsExchange};
//!
//! // Outside the guard, on the way in:
//! let mut request = http::Request::post("/mcp").body(()).unwrap();
//! request.extensions_mut().insert(WantsExchange);
//!
//! // On the way out: how many tool calls went to the server remapped.
//! fn remapped_tool_calls<B>(response: &http::Response<B>) -> usize {
//!     response.extensions().get::<Exchange>().map_or(0, |exchange| {
//!         exchange
//!             .iter()
//!             .filter(|handled| {
//!                 handled.method() == McpMethod::ToolsCall
//!                     && handled.decision() == GuardDecision::Remapped
//!             })
//!             .count()
//!     })
//! }
//! assert_eq!(remapped_tool_calls(&http::Response::new(())), 0);
//! ```

pub use crate::guard::exchange::{Exchange, GuardDecision, Handled, WantsExchange};
pub use crate::wire::method::McpMethod;
