//! Request bodies read whole, under an operator's memory budget, before the
//! inner service sees them: [`BodyBufferLayer`].
//!
//! A server that reads each request body into memory (the guard does, for
//! the POSTs it tracks) holds whatever the client sends until it is
//! complete: one HTTP/2 connection with 200 streams of 4 MiB each held
//! 800 MiB, and a body the guard does not read streamed to the upstream
//! as slowly as it came, holding an upstream connection all along. This
//! layer reads every body that is not already complete, before the inner
//! service is called, as nginx does (`proxy_request_buffering`), and counts
//! what it holds against two budgets:
//!
//! - a [`BodyBudget`] shared by every connection (64 MiB in the binary),
//!   like the session table's byte budget;
//! - a share per connection ([`BodyBufferLayer::per_connection`], 4 MiB):
//!   the streams of one HTTP/2 connection count together, as Envoy bounds
//!   buffering per connection;
//!
//! and holds every body to a size cap ([`BodyBufferLayer::max_body_bytes`],
//! 4 MiB), tracked or not. A body whose `Content-Length` is over the cap
//! gets `413` at once; one whose `Content-Length` does not fit what is left
//! of a budget gets `503` at once (nothing of it is read); a body without a
//! length is counted as it arrives and refused the same way when it
//! outgrows the cap or a budget. Every refusal is a JSON-RPC error with
//! `id: null` (the body, which holds the id, was not read), marked
//! [`Refused::BodyTooLarge`](super::Refused::BodyTooLarge) or
//! [`Refused::BodyBudget`](super::Refused::BodyBudget), with
//! `Connection: close` on HTTP/1 (the rest of the body is unread). A body
//! is counted from its first byte (or its `Content-Length`, reserved up
//! front) until the inner service has answered (its response head): until
//! then the inner service may hold the bytes (the proxy keeps a copy to
//! answer in the upstream's place). So at most the budget is held in
//! request bodies, however many connections and streams there are.
//!
//! Since the inner service is called only once the body is complete, a
//! body that trickles holds no upstream connection; put
//! [`BodyPaceLayer`](super::BodyPaceLayer) outside this layer, and its idle
//! timeout and minimum rate bound how long the reading takes. The inner
//! service gets the body as one [`Full`](http_body_util::Full) buffer (an
//! empty one for a request without a body).
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use mcp_id_guard::protect::buffer::{BodyBudget, BodyBufferLayer};
//! use mcp_id_guard::protect::Refused;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let budget = BodyBudget::new(64 * 1024 * 1024);
//! let service = ServiceBuilder::new()
//!     .layer(
//!         BodyBufferLayer::new(budget.clone())
//!             .per_connection(1024 * 1024)
//!             .max_body_bytes(16),
//!     )
//!     .service(service_fn(|request: http::Request<Full<Bytes>>| async move {
//!         let body = request.into_body().collect().await?.to_bytes();
//!         Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(body)))
//!     }));
//!
//! let small = http::Request::post("/mcp").body(Full::new(Bytes::from("{}")))?;
//! let response = service.clone().oneshot(small).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(budget.used(), 0, "released once the service answered");
//!
//! let large = http::Request::post("/mcp").body(Full::new(Bytes::from(vec![b' '; 17])))?;
//! let response = service.oneshot(large).await?;
//! assert_eq!(response.status(), 413);
//! assert_eq!(response.extensions().get::<Refused>(), Some(&Refused::BodyTooLarge));
//! # Ok(())
//! # }
//! ```

mod budget;
mod client;
mod future;
mod layer;
mod service;

pub use budget::{BodyBudget, HeldBody, OverBudget};
pub use future::BufferFuture;
pub use layer::BodyBufferLayer;
pub use service::BodyBuffer;
#[cfg(test)]
mod tests;
