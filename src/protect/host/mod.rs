//! DNS-rebinding protection: which `Host` and `Origin` values are served.
//!
//! A web page from `http://evil.example` can make the victim's browser send
//! requests to a server on the victim's loopback interface by pointing its own
//! DNS name at `127.0.0.1` after the page loaded ("rebinding"). The browser
//! still believes it talks to `evil.example`, so the request carries
//! `Host: evil.example:<port>` and, on a POST, `Origin: http://evil.example:<port>`.
//! Checking both against the names the server is really reached by stops it,
//! which is what the MCP SDKs do (python-sdk's `TransportSecuritySettings`,
//! rmcp's `allowed_hosts`). A proxy sets `Host` to the upstream's own
//! authority, so the upstream's check can no longer see the browser's `Host`:
//! the proxy has to check it itself, before anything else.
//!
//! [`HostLayer`] applies a [`HostPolicy`] to every request, before the inner
//! service sees it (put it outermost, outside
//! [`IdGuardLayer`](crate::IdGuardLayer)). A request it refuses gets
//! `421 Misdirected Request` (its `Host`) or `403 Forbidden` (its `Origin`),
//! with a JSON-RPC `-32600` error whose `id` is `null` (the body was never
//! read), and the response carries the [`Refused`](super::Refused) kind as
//! an extension.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use http_body_util::{BodyExt, Empty};
//! use mcp_id_guard::protect::host::{HostLayer, HostPolicy};
//! use mcp_id_guard::protect::Refused;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let service = ServiceBuilder::new()
//!     .layer(HostLayer::new(HostPolicy::loopback()))
//!     .service(service_fn(|_request: http::Request<Empty<bytes::Bytes>>| async {
//!         Ok::<_, Infallible>(http::Response::new(Empty::<bytes::Bytes>::new()))
//!     }));
//!
//! // A rebound page: its own name, on the victim's loopback address.
//! let rebound = http::Request::post("/mcp")
//!     .header("host", "evil.example:8080")
//!     .body(Empty::new())?;
//! let response = service.clone().oneshot(rebound).await?;
//! assert_eq!(response.status(), 421);
//! assert_eq!(response.extensions().get::<Refused>(), Some(&Refused::Host));
//! let body = response.into_body().collect().await?.to_bytes();
//! let error: serde_json::Value = serde_json::from_slice(&body)?;
//! assert_eq!(error["error"]["code"], -32600);
//!
//! // The right name, but a foreign page's Origin.
//! let foreign = http::Request::post("/mcp")
//!     .header("host", "localhost:8080")
//!     .header("origin", "https://evil.example")
//!     .body(Empty::new())?;
//! assert_eq!(service.clone().oneshot(foreign).await?.status(), 403);
//!
//! let local = http::Request::post("/mcp")
//!     .header("host", "127.0.0.1:8080")
//!     .body(Empty::new())?;
//! assert_eq!(service.oneshot(local).await?.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
//! Refusals are logged (a warning) at most once per 10 s per kind, with the
//! count of the others: a rebinding page can send thousands of requests.

mod layer;
mod pattern;
mod policy;
mod service;

pub use layer::HostLayer;
pub use pattern::InvalidPattern;
pub use policy::HostPolicy;
pub use service::HostCheck;
