//! A pace for request bodies: [`BodyPaceLayer`].
//!
//! A client that opens a request and then sends its body slowly holds a
//! connection, a task and whatever the server reserved for the request, for
//! as long as it likes: one byte every 5 s keeps a body alive for hours
//! under any per-pause limit of more than 5 s. The layer wraps each request
//! body in a [`PacedBody`] that holds it to two limits:
//!
//! - **idle timeout** ([`BodyPaceLayer::idle_timeout`], 30 s): the reader
//!   waits at most this long for the next piece of the body. The pause
//!   counts from when the reader started waiting, not from the last piece: a
//!   reader slowed by what it feeds (the upstream, a queue) is not the
//!   client's fault.
//! - **minimum data rate** ([`BodyPaceLayer::min_rate`], 240 bytes/s after a
//!   [`grace`](BodyPaceLayer::grace) of 5 s, Kestrel's defaults; Apache's
//!   `mod_reqtimeout` asks 500): once the reader has waited for the body
//!   longer than the grace period, the body must have arrived at this rate
//!   over that waiting time. As in Kestrel, only the time the reader spends
//!   waiting for the client counts, for the reason above. Unlike Kestrel's
//!   average, the rate is judged over a window: data earns waiting at the
//!   minimum rate, but a body never has more than one idle timeout (or,
//!   without one, one grace period) of waiting in hand, so a burst of
//!   megabytes followed by a byte every 20 s is cut within that window
//!   instead of earning hours of credit.
//!
//! One timer per body, made at its first pause and reset after; a body that
//! is complete when the request arrives (a `GET`, a buffered body) is not
//! watched at all.
//!
//! When a body breaks its pace, it yields a [`PaceError`] to whatever reads
//! it (the guard, the proxy, the server), which fails its read. If the inner
//! service then answers (it has not answered before), the layer replaces
//! that answer with `408 Request Timeout` and a JSON-RPC `-32600` error
//! whose `id` is `null`, marked [`Refused::BodyIdle`](super::Refused::BodyIdle)
//! or [`Refused::BodySlow`](super::Refused::BodySlow). On HTTP/1 the `408`
//! carries `Connection: close`, so hyper closes the connection after it (the
//! rest of the body may still be on its way). On HTTP/2 only the stream
//! ends: hyper resets the request's stream once its response is complete,
//! and the connection serves its other streams on. A body that breaks its
//! pace after the inner service answered (a streaming server) only fails:
//! the service's answer, already under way, is passed on.
//!
//! Put the layer outside [`IdGuardLayer`](crate::IdGuardLayer): the guard
//! reads tracked bodies itself, and its reads are what the layer times.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body::Frame;
//! use http_body_util::{BodyExt, Full, StreamBody};
//! use mcp_id_guard::protect::pace::{BodyPaceLayer, PacedBody};
//! use mcp_id_guard::protect::Refused;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! type Silent = StreamBody<futures::stream::Pending<Result<Frame<Bytes>, Infallible>>>;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let service = ServiceBuilder::new()
//!     .layer(
//!         BodyPaceLayer::new()
//!             .idle_timeout(Some(Duration::from_millis(50)))
//!             .min_rate(240)
//!             .grace(Duration::from_secs(5)),
//!     )
//!     .service(service_fn(|request: http::Request<PacedBody<Silent>>| async move {
//!         // A server that reads the whole body, and answers 400 when it
//!         // cannot.
//!         let status = match request.into_body().collect().await {
//!             Ok(_) => 200,
//!             Err(_) => 400,
//!         };
//!         let mut response = http::Response::new(Full::<Bytes>::default());
//!         *response.status_mut() = http::StatusCode::from_u16(status)?;
//!         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
//!     }));
//!
//! // A client that sends the head and then nothing.
//! let silent: Silent = StreamBody::new(futures::stream::pending());
//! let request = http::Request::post("/mcp").body(silent)?;
//! let response = service.oneshot(request).await?;
//! assert_eq!(response.status(), 408);
//! assert_eq!(response.extensions().get::<Refused>(), Some(&Refused::BodyIdle));
//! assert_eq!(response.headers()["connection"], "close");
//! # Ok(())
//! # }
//! ```

mod body;
mod future;
mod layer;
mod service;

pub use body::{PaceError, PacedBody};
pub use future::PaceFuture;
pub use layer::BodyPaceLayer;
pub use service::BodyPace;
