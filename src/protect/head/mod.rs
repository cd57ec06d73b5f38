//! A limit on the size of the request head: [`HeadLimitLayer`].
//!
//! Large headers cost memory in every layer that copies them and in the
//! server behind; MCP requests carry a handful of short ones. A request
//! whose head (the request line and every header, counted as HTTP/1.1 sends
//! them: `name: value` and a line break each) is over the limit gets `431
//! Request Header Fields Too Large` with a JSON-RPC `-32600` error whose `id`
//! is `null`, and never reaches the inner service. The response carries
//! [`Refused::HeadSize`](super::Refused::HeadSize) as an extension.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use http_body_util::Empty;
//! use mcp_id_guard::protect::head::HeadLimitLayer;
//! use mcp_id_guard::protect::Refused;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let service = ServiceBuilder::new()
//!     .layer(HeadLimitLayer::new(1024))
//!     .service(service_fn(|_request: http::Request<Empty<bytes::Bytes>>| async {
//!         Ok::<_, Infallible>(http::Response::new(Empty::<bytes::Bytes>::new()))
//!     }));
//!
//! let small = http::Request::post("/mcp").body(Empty::new())?;
//! assert_eq!(service.clone().oneshot(small).await?.status(), 200);
//!
//! let large = http::Request::post("/mcp")
//!     .header("x-padding", "a".repeat(2000))
//!     .body(Empty::new())?;
//! let response = service.oneshot(large).await?;
//! assert_eq!(response.status(), 431);
//! assert_eq!(response.extensions().get::<Refused>(), Some(&Refused::HeadSize));
//! # Ok(())
//! # }
//! ```
//!
//! # What a layer cannot enforce
//! A layer sees a request only after the server has read and parsed its
//! whole head. A head larger than the server's read buffer never becomes a
//! request: hyper answers it with a bare `431` (no JSON-RPC body) and closes
//! the connection, and until then it holds the buffer. So the server must
//! bound heads itself, a little above this layer's limit so that a head
//! slightly over it still gets the JSON-RPC answer: for hyper's HTTP/1.1,
//! `http1().max_buf_size(limit + 8 KiB)` (at least 8 KiB, its minimum); for
//! HTTP/2, `http2().max_header_list_size(limit)`, which hyper enforces on
//! the decoded header list. The `mcp-id-guard` binary sets both from
//! `--max-header-bytes`. `axum::serve` takes no hyper settings (its
//! defaults: about 408 KiB for HTTP/1.1, 16 KiB for HTTP/2): serve the
//! `Router` with [`Server`](crate::server::Server) (feature `server`), whose
//! `max_header_bytes` sets both, or with hyper-util's
//! `server::conn::auto::Builder`. How long a client may take to send its head is a
//! connection-level limit too (hyper's `header_read_timeout`).

mod layer;
mod service;

pub use layer::HeadLimitLayer;
pub use service::HeadLimit;
