//! Request bodies read whole, under an operator's memory budget that counts
//! what has arrived, before the inner service sees them: [`BodyBufferLayer`].
//!
//! A server that reads each request body into memory (the guard does, for
//! the POSTs it tracks) holds whatever the client sends until it is
//! complete: one HTTP/2 connection with 200 streams of 4 MiB each held
//! 800 MiB, and a body the guard does not read streamed to the upstream
//! as slowly as it came, holding an upstream connection all along. This
//! layer reads every body that is not already complete, before the inner
//! service is called, as nginx does (`proxy_request_buffering`), and holds
//! every body to a size cap ([`BodyBufferLayer::max_body_bytes`], 4 MiB),
//! tracked or not: a `Content-Length` over it gets `413` at once, a body
//! without one when it outgrows it.
//!
//! # What a body is charged for
//! A body is charged for the bytes that have **arrived** of it, never for
//! what its `Content-Length` announces, against
//!
//! - a [`BodyBudget`] shared by every connection (64 MiB in the binary),
//!   like the session table's byte budget, of which a part (an eighth by
//!   default, [`BodyBudget::reserve_for_small_bodies`]) is kept for small
//!   bodies (64 KiB at most by default) whose bytes have all arrived:
//!   bodies still arriving, and larger ones, together hold at most the
//!   rest;
//! - a share per client address, if the budget has one
//!   ([`BodyBudget::per_client`], half the budget in the binary), for every
//!   body of the address still arriving (and every large one), across the
//!   address's connections ([`BodyBufferLayer::for_client`]);
//! - a share per connection ([`BodyBufferLayer::per_connection`], 4 MiB):
//!   the streams of one HTTP/2 connection count together, as Envoy bounds
//!   buffering per connection.
//!
//! A body that outgrows what one of them has left gets `503`; the body
//! refused is the one growing. Every refusal is a JSON-RPC error with
//! `id: null` (the body, which holds the id, was not read), marked
//! [`Refused::BodyTooLarge`](super::Refused::BodyTooLarge) or
//! [`Refused::BodyBudget`](super::Refused::BodyBudget), with
//! `Connection: close` on HTTP/1 (the rest of the body is unread). A body
//! is counted from its first byte until the inner service has answered (its
//! response head): until then the inner service may hold the bytes (the
//! proxy keeps a copy to answer in the upstream's place). The charge is the
//! buffer's capacity, which doubles as bytes arrive (at most twice what
//! arrived, and never past the `Content-Length`): at most the budget is
//! held in request bodies, however many connections and streams there are.
//! [`BodyBudget::used`] and [`BodyBudget::bodies`] say what is held (the
//! binary's `/metrics`: `mcp_id_guard_held_request_body_bytes` and
//! `mcp_id_guard_held_request_bodies`, registered with
//! [`Metrics::register_body_budget`](super::metrics::Metrics::register_body_budget)).
//!
//! # Why: a budget no client can hold cheaply
//! The budget used to hold each body's whole `Content-Length` from before
//! its first byte. 16 connections announcing 4 MiB and sending 250 B/s
//! (above the minimum rate) held all 64 MiB: for 75 s, 0 of 38 pings and
//! 0 of 13 POSTs of 1 MiB were accepted, over HTTP/1.1 and HTTP/2. How
//! others answer it:
//!
//! - nginx buffers a body in memory up to `client_body_buffer_size` (8 or 16 KiB)
//!   and spools the rest to a temporary file: memory follows what arrived,
//!   and disk absorbs what is large;
//! - Envoy bounds each connection's buffers (`per_connection_buffer_limit_bytes`)
//!   with flow control, and its overload manager, past a heap threshold,
//!   resets the streams holding the most buffered bytes;
//! - Kestrel does not buffer bodies for the application; it cuts a body
//!   slower than a minimum data rate (240 B/s after a 5 s grace).
//!
//! The guard must see a tracked body whole before the upstream does, and
//! keeps it in memory (spooling to disk would add file I/O and temporary
//! files to every large body, and a disk to fill). So it charges what has
//! arrived, as nginx's memory and Envoy's buffer accounting follow what
//! arrived, not what was announced: announcing is free, sending is not,
//! and to hold N bytes a client must send N bytes and keep sending at
//! [`BodyPaceLayer`](super::pace::BodyPaceLayer)'s minimum rate (Kestrel's),
//! which bounds how long it holds them. The reserve keeps small requests
//! (pings, tool calls, whose bytes come in one piece) flowing while slow
//! bodies fill the rest: it is only for bodies whose bytes have all
//! arrived, so slow bodies cannot take it, however small they stay (16
//! slow bodies of 64 KiB each took a whole 1 MiB budget while any small
//! body could draw on it). The per-connection share (Envoy's) and the
//! per-address share bound one connection and one address; the address's
//! share counts every body of it still arriving, small ones included (one
//! address keeping a thousand bodies of 64 KiB open held all 64 MiB while
//! it counted large bodies only). A per-address share alone would not do:
//! behind a TLS terminator every client has the terminator's address, and
//! addresses are cheap to come by; so a small body whose bytes have all
//! arrived leaves the share (it draws on the reserve), and one client
//! filling its address's share does not lock out the small requests of the
//! others behind it.
//!
//! What is left: clients from many addresses that each keep slow bodies
//! at the minimum rate hold the budget less the reserve for as long as
//! they keep pace, and a legitimate large body arriving meanwhile can find
//! no room (small ones still pass). Envoy's answer, resetting the largest
//! or oldest holders to make room, is not done: the body refused is the
//! one that grows past what is left.
//!
//! Another face reading bodies itself (an ASGI server, say, where uvicorn
//! bounds no body) charges the same budget with [`BodyBudget::hold`] or
//! [`BodyBudget::hold_for`], [`HeldBody::grow_to`] as bytes arrive and
//! [`HeldBody::complete`] for the last ones.
//!
//! Since the inner service is called only once the body is complete, a
//! body that trickles holds no upstream connection; put
//! [`BodyPaceLayer`](super::pace::BodyPaceLayer) outside this layer, and its idle
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
