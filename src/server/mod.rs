//! The parts of an HTTP server's protection that no per-request layer can
//! hold, around any tower service: how long a client may take to send a
//! request head (protocol detection and the HTTP/2 preface included), stay
//! idle between requests, or leave a response unread; how many requests one
//! connection may carry and how many HTTP/2 streams its client may reset
//! (a "rapid reset" flood); how many connections are open at once (idle
//! ones making room for new ones at the cap); backing off when `accept`
//! fails; and a graceful shutdown with a grace period.
//!
//! hyper's own header timer covers neither hyper-util's protocol detection
//! (which reads the first bytes with no timer at all) nor HTTP/2, so a
//! connection that sends nothing, part of the HTTP/2 preface, or the preface
//! and then silence would stay open for ever. Here one watchdog per
//! connection knows whether a request is in progress (from the service and
//! the response body) and whether bytes have arrived since the connection
//! went idle (from the socket), and closes the connection when its deadline
//! passes. Past its request or reset budget a connection is closed
//! gracefully (GOAWAY on HTTP/2) and what still arrives on it is answered
//! here, never passed to the service: HTTP/2 streams are refused
//! (`REFUSED_STREAM`, which clients retry), HTTP/1.1 requests get `503` with
//! a JSON-RPC error (marked [`Refused::ConnectionClosing`]).
//!
//! The per-request protections are layers ([`protect`](crate::protect)),
//! composed into the service that [`Server::serve`] gets for each
//! connection:
//!
//! ```no_run
//! use std::time::Duration;
//! use mcp_id_guard::protect::metrics::{Metrics, MetricsLayer};
//! use mcp_id_guard::proxy::Proxy;
//! use mcp_id_guard::server::Server;
//! use mcp_id_guard::IdGuardLayer;
//! use tower_layer::Layer;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let proxy = Proxy::new("http://127.0.0.1:8000")?;
//! let guard = IdGuardLayer::new();
//! let metrics = Metrics::new();
//! let server = Server::builder()
//!     .header_read_timeout(Some(Duration::from_secs(10)))
//!     .max_connections(512)
//!     .metrics(metrics.clone())
//!     .build();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! server
//!     .serve(
//!         listener,
//!         |client| {
//!             MetricsLayer::new(metrics.clone())
//!                 .layer(guard.layer(proxy.clone().with_client_addr(client)))
//!         },
//!         async { tokio::signal::ctrl_c().await.unwrap_or(()) },
//!     )
//!     .await;
//! # Ok(()) }
//! ```
//!
//! # Serving an axum application
//! `axum::serve` takes no hyper settings, so it cannot bound a request head
//! below hyper's defaults (an HTTP/1.1 read buffer of about 408 KiB, an
//! HTTP/2 header list of 16 KiB). The same `Router` served by a [`Server`]
//! gets [`max_header_bytes`](ServerBuilder::max_header_bytes) (HTTP/1.1
//! `max_buf_size(limit + 8 KiB)`, HTTP/2 `max_header_list_size(limit)`) and
//! the other connection-level protections:
//!
//! ```no_run
//! use mcp_id_guard::server::Server;
//!
//! # #[tokio::main] async fn main() -> std::io::Result<()> {
//! // The application of the quick start: the MCP service behind its layers.
//! let app: axum::Router = axum::Router::new();
//! let server = Server::builder().max_header_bytes(Some(16 * 1024)).build();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
//! server
//!     .serve(listener, move |_client| app.clone(), async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     })
//!     .await;
//! # Ok(()) }
//! ```

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tower_service::Service;

use crate::protect::metrics::Metrics;
#[cfg(doc)]
use crate::protect::Refused;

mod accept;
mod activity;
mod body;
mod connection;
mod io;
mod listener;
mod watchdog;

pub use listener::Listener;

/// A request body as the server hands it to the service: hyper's, as the
/// client sends it. Its pace is the [`BodyPaceLayer`](crate::protect::pace::BodyPaceLayer)'s
/// to check; the server closes the connection after that layer's `408`.
pub type ClientBody = hyper::body::Incoming;

/// Read buffer room beyond `max_header_bytes`, so a head a little over the
/// limit still reaches the service (whose head-size check answers it with a
/// JSON-RPC error) instead of hyper's bare `431`.
const HEAD_BUFFER_SLACK: usize = 8 * 1024;
/// hyper's smallest HTTP/1 read buffer.
const MIN_READ_BUFFER: usize = 8 * 1024;

/// The client-side time limits; `None` turns one off.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// From the connection's start (or, on HTTP/1.1, the first byte of a
    /// later request) to a whole request head.
    pub(super) header_read: Option<Duration>,
    /// Between requests on a kept-alive connection.
    pub(super) keep_alive: Option<Duration>,
    /// A request body's longest pause.
    /// The longest a write to the client may stay blocked (the client does
    /// not read what it asked for).
    pub(super) send: Option<Duration>,
    /// Requests one connection may carry.
    pub(super) max_requests: Option<u64>,
    /// Streams an HTTP/2 client may reset before their response ended.
    pub(super) resets: Option<ResetBudget>,
}

/// How many HTTP/2 streams a client may reset before their response ended:
/// the connection closes once `max` were, within one `window`, and they are
/// at least half the streams it opened in that window (so that a busy client
/// that cancels some of its calls is not cut).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResetBudget {
    pub(super) max: u32,
    pub(super) window: Duration,
}

/// An HTTP/1.1 and HTTP/2 server for a tower service, with the
/// connection-level protections of the [module docs](self). Built with
/// [`Server::builder`]; cheap to clone.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Setup>,
}

/// The error of the service a connection serves, as hyper takes it.
type ServiceError = Box<dyn std::error::Error + Send + Sync>;

/// What every connection of a server shares.
struct Setup {
    limits: Limits,
    max_connections: usize,
    close_idle_at_capacity: bool,
    grace_period: Duration,
    metrics: Option<Metrics>,
    http: auto::Builder<TokioExecutor>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("limits", &self.shared.limits)
            .field("max_connections", &self.shared.max_connections)
            .field(
                "close_idle_at_capacity",
                &self.shared.close_idle_at_capacity,
            )
            .field("grace_period", &self.shared.grace_period)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A builder with the defaults of the `mcp-id-guard` binary.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// Accepts connections on `listener` (a Tokio `TcpListener`, or any
    /// other [`Listener`]) and serves each with the service
    /// `make_service` builds for its client's address, until `shutdown`
    /// resolves. Then it stops accepting, lets open connections finish
    /// their requests (HTTP/1.1 closes after the current response, HTTP/2
    /// gets a GOAWAY) for the [grace period](ServerBuilder::grace_period),
    /// cuts those still open, and returns.
    ///
    /// A service error closes its request's stream (HTTP/2) or connection
    /// (HTTP/1.1), as hyper does.
    pub async fn serve<L, M, S, B, F>(&self, listener: L, make_service: M, shutdown: F)
    where
        L: Listener,
        M: FnMut(L::Addr) -> S,
        S: Service<Request<ClientBody>, Response = Response<B>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn Error + Send + Sync>>,
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn Error + Send + Sync>>,
        F: Future<Output = ()>,
    {
        accept::serve(&self.shared, listener, make_service, shutdown).await;
    }
}

/// Settings of a [`Server`]. A limit set to `None` is off.
///
/// ```
/// use std::time::Duration;
/// use mcp_id_guard::server::Server;
///
/// let server = Server::builder()
///     .keep_alive_timeout(Some(Duration::from_secs(30)))
///     .max_requests_per_connection(Some(100))
///     .client_resets(100, Duration::from_secs(30))
///     .grace_period(Duration::from_secs(10))
///     .build();
/// # let _ = server;
/// ```
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    limits: Limits,
    max_connections: usize,
    close_idle_at_capacity: bool,
    grace_period: Duration,
    max_header_bytes: Option<usize>,
    metrics: Option<Metrics>,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        Self {
            limits: Limits {
                header_read: Some(Duration::from_secs(10)),
                keep_alive: Some(Duration::from_secs(75)),
                send: Some(Duration::from_secs(60)),
                max_requests: Some(1000),
                resets: Some(ResetBudget {
                    max: 250,
                    window: Duration::from_secs(60),
                }),
            },
            max_connections: 1024,
            close_idle_at_capacity: true,
            grace_period: Duration::from_secs(5),
            max_header_bytes: Some(32 * 1024),
            metrics: None,
        }
    }
}

impl ServerBuilder {
    /// How long a client may take to send a whole request head: from the
    /// connection's start (protocol detection and the HTTP/2 preface
    /// included), and on HTTP/1.1 from the first byte of each later request
    /// (default 10 s).
    pub fn header_read_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.limits.header_read = timeout;
        self
    }

    /// How long a connection may stay idle between requests (default 75 s).
    pub fn keep_alive_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.limits.keep_alive = timeout;
        self
    }

    /// How long a write to the client may stay blocked, or an HTTP/2
    /// response go unread, before the connection is dropped (default 60 s).
    pub fn send_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.limits.send = timeout;
        self
    }

    /// How many connections may be open at once (default 1024): when all
    /// are, the server stops accepting (the kernel's backlog holds new ones)
    /// instead of running out of file descriptors. Size it from the
    /// descriptor limit, leaving room for each connection's upstream
    /// connection if the service opens one (and one more descriptor: see
    /// [`close_idle_at_capacity`](Self::close_idle_at_capacity)).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Whether idle connections make room at the
    /// [connection cap](Self::max_connections) (default on), as nginx
    /// closes its idle keep-alive connections when it runs out: with all
    /// connections open, the next one is accepted to wait (one over the
    /// cap), and the connection idle the longest — no request in progress,
    /// no byte of a next request head — is closed gracefully for it. A
    /// request that races with that close is still served, as its
    /// connection's last. While none is idle, the new connection waits for
    /// one to close or become idle. Off, the server stops accepting at the
    /// cap, and connections that sit idle keep it full until their
    /// keep-alive timeout.
    pub fn close_idle_at_capacity(mut self, on: bool) -> Self {
        self.close_idle_at_capacity = on;
        self
    }

    /// How many requests one connection may carry, as HTTP/1.1 keep-alive
    /// requests or HTTP/2 streams (default 1000): the last is answered with
    /// `Connection: close` or followed by a GOAWAY.
    pub fn max_requests_per_connection(mut self, max: Option<u64>) -> Self {
        self.limits.max_requests = max.filter(|max| *max > 0);
        self
    }

    /// How many HTTP/2 streams a client may reset before their response
    /// ended within `window` (default 250 per minute): at `max`, when they
    /// are also at least half the streams it opened in the window, the
    /// connection closes. `max` 0 or a zero `window` turns it off.
    pub fn client_resets(mut self, max: u32, window: Duration) -> Self {
        self.limits.resets = (max > 0 && !window.is_zero()).then_some(ResetBudget { max, window });
        self
    }

    /// After shutdown, how long open connections may finish their requests
    /// before they are cut (default 5 s).
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// Bounds each connection's HTTP/1 read buffer and the HTTP/2 header
    /// list to about this many bytes of request head (default 32 KiB;
    /// `None`: hyper's defaults, about 400 KiB). A head that outgrows the
    /// buffer gets hyper's own bare `431`; put a head-size layer in the
    /// service for a precise one.
    pub fn max_header_bytes(mut self, max: Option<usize>) -> Self {
        self.max_header_bytes = max.filter(|max| *max > 0);
        self
    }

    /// Records connections closed for a budget, HTTP/2 streams reset by the
    /// client, open connections and the requests refused on closing
    /// connections into `metrics`.
    /// [`Metrics::register`] writes these families once a server records
    /// into the metrics.
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        metrics.record_connections();
        self.metrics = Some(metrics);
        self
    }

    /// The server.
    pub fn build(self) -> Server {
        let mut http = auto::Builder::new(TokioExecutor::new());
        // The watchdog times request heads (hyper's own timer would also cut
        // idle keep-alive connections, and never sees protocol detection or
        // HTTP/2).
        http.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None);
        http.http2().timer(TokioTimer::new());
        if let Some(max) = self.max_header_bytes {
            http.http1()
                .max_buf_size(max.saturating_add(HEAD_BUFFER_SLACK).max(MIN_READ_BUFFER));
            http.http2()
                .max_header_list_size(u32::try_from(max).unwrap_or(u32::MAX));
        }
        Server {
            shared: Arc::new(Setup {
                limits: self.limits,
                max_connections: self.max_connections,
                close_idle_at_capacity: self.close_idle_at_capacity,
                grace_period: self.grace_period,
                metrics: self.metrics,
                http,
            }),
        }
    }
}
