//! The body and future types of [`IdGuard`](crate::IdGuard), kept out of
//! the crate root as tower-http keeps each middleware's: a user names them
//! only in the bounds of a service written around the guard, or in a test.
//!
//! | type | what it is |
//! |---|---|
//! | [`GuardRequestBody`] | the body of the request the inner service receives ([`inner::InnerRequest`](crate::inner::InnerRequest)) |
//! | [`GuardResponseBody`] | the body of the guard's response: the inner service's, ids restored as it streams, or the guard's own answer |
//! | [`GuardFuture`] | the guard's response future (it reads a tracked POST's body before it calls the inner service) |
//!
//! They are named for the guard, not `RequestBody`, `ResponseBody` and
//! `ResponseFuture` as in tower-http's modules: rustc prints a type by its
//! last path segment, and a stack of tower-http layers around the guard
//! would otherwise print two different `ResponseBody<…>` in one error.
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use mcp_id_guard::guard::{GuardFuture, GuardRequestBody, GuardResponseBody};
//! use mcp_id_guard::IdGuardLayer;
//! use tower::{Layer as _, Service as _, ServiceExt as _};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Infallible> {
//! let server = tower::service_fn(|_request: http::Request<GuardRequestBody<Full<Bytes>>>| async {
//!     Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
//! });
//! let mut guard = IdGuardLayer::new().layer(server);
//! let future: GuardFuture<_, Full<Bytes>> =
//!     guard.ready().await?.call(http::Request::new(Full::new(Bytes::new())));
//! let response: http::Response<GuardResponseBody<Full<Bytes>>> = future.await?;
//! # let _ = response;
//! # Ok(())
//! # }
//! ```

// How the guard works inside: it reads each POST's envelope, asks the session
// table for a decision (`admit`), and follows the response until the id is
// released.
pub(crate) mod admit;
pub(crate) mod body;
pub(crate) mod exchange;
pub(crate) mod future;
pub(crate) mod layer;
pub(crate) mod reader;
pub(crate) mod service;
pub(crate) mod unanswered;

// The public paths: here only the bodies and the future, each renamed for the
// guard (the definitions keep their short names inside the crate). The
// layer and the service are at the crate root, the exchange protocol in
// `crate::exchange`, `Unanswered` in `crate::inner`.
pub use body::{RequestBody as GuardRequestBody, ResponseBody as GuardResponseBody};
pub use future::ResponseFuture as GuardFuture;

// Crate-internal paths, unchanged by the move of the public ones (some are
// used only under some features).
#[allow(unused_imports)]
pub(crate) use crate::wire::method::McpMethod;
pub(crate) use admit::PendingForward;
pub(crate) use body::RequestBody;
#[allow(unused_imports)]
pub(crate) use exchange::{Exchange, GuardDecision, Handled};
#[allow(unused_imports)]
pub(crate) use layer::IdGuardLayer;
#[allow(unused_imports)]
pub(crate) use unanswered::Unanswered;
