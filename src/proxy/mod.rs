//! A reverse proxy service: [`IdGuardLayer`](crate::IdGuardLayer) in front of an
//! MCP server reached over HTTP, for servers written in any language.
//!
//! [`Proxy`] is a [`tower_service::Service`] that forwards every request to an
//! upstream base URL over pooled HTTP/1.1 connections and streams the answer
//! back. Wrapped in the guard, it is the whole proxy:
//!
//! ```
//! use http_body_util::{BodyExt, Full};
//! use mcp_id_guard::proxy::Proxy;
//! use mcp_id_guard::IdGuardLayer;
//! use tower::ServiceExt;
//! use tower_layer::Layer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // Nothing listens on this port, so the proxy answers 502 itself.
//! let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! let guard = IdGuardLayer::new();
//! let service = guard.layer(Proxy::new(&format!("http://127.0.0.1:{port}/mcp"))?);
//!
//! let request = http::Request::post("/mcp")
//!     .header("content-type", "application/json")
//!     .header("mcp-session-id", "session-1")
//!     .body(Full::new(bytes::Bytes::from_static(
//!         br#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#,
//!     )))?;
//! let response = service.oneshot(request).await?; // the error type is Infallible
//! assert_eq!(response.status(), 502);
//! let body = response.into_body().collect().await?.to_bytes();
//! let error: serde_json::Value = serde_json::from_slice(&body)?;
//! assert_eq!(error["id"], 7);
//! assert_eq!(error["error"]["code"], -32603);
//! assert_eq!(guard.stats().in_flight_requests, 0);
//! # Ok(())
//! # }
//! ```
//!
//! The `mcp-id-guard` binary (`cargo install --path . --features cli` from
//! a checkout) serves exactly this service; the `embedded_proxy` example serves it from a
//! program of one's own. Under axum, mount it with `route_service` or
//! `fallback_service` (`nest_service` strips its prefix from the path before
//! the proxy sees it):
//!
//! ```
//! use mcp_id_guard::proxy::Proxy;
//! use mcp_id_guard::IdGuardLayer;
//! use tower_layer::Layer;
//!
//! # fn main() -> Result<(), mcp_id_guard::proxy::InvalidUpstream> {
//! let guarded = IdGuardLayer::new().layer(Proxy::new("http://127.0.0.1:8000")?);
//! // A request for /mcp?x=1 goes to http://127.0.0.1:8000/mcp?x=1.
//! let app: axum::Router = axum::Router::new()
//!     .route("/healthz", axum::routing::get(|| async { "ok" }))
//!     .route_service("/mcp", guarded);
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! # Forwarding
//! - **Target.** The request's path and query are appended to the upstream
//!   base: with upstream `http://127.0.0.1:8000/prefix`, a request for
//!   `/mcp?x=1` goes to `http://127.0.0.1:8000/prefix/mcp?x=1`. Only plain
//!   `http` upstreams are supported (run the guard next to the server).
//!   Requests that could leave the prefix or name another target than the
//!   one checked are answered `400` and never forwarded: a path with a `.`
//!   or `..` segment (also percent-encoded), authority-form targets, and a `Host` header that differs from the target's authority
//!   (absolute-form targets, HTTP/2 `:authority`).
//! - **Methods and bodies.** Every method passes (POST, GET for standalone and
//!   resumed SSE streams, DELETE, ...) but `TRACE` and `CONNECT`, which the
//!   proxy answers itself with `405` and an `Allow` header, and `OPTIONS *`
//!   (asterisk form: the server in general), which it answers with `200`
//!   and `Allow`; none of them reaches the upstream. Request and response bodies stream
//!   frame by frame: each server-sent event reaches the client as soon as the
//!   upstream sends it. The one exception is described under *Errors*.
//! - **End-to-end headers** pass both ways untouched: `Mcp-Session-Id`,
//!   `MCP-Protocol-Version`, `Last-Event-ID`, `Authorization`, `Accept`,
//!   `Content-Type`, `Origin`, `WWW-Authenticate`, ...
//! - **Hop-by-hop headers** are dropped both ways (RFC 9110 §7.6.1):
//!   `Connection` and every header it names, `Keep-Alive`, `Proxy-Connection`,
//!   `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, `Proxy-Authenticate` and
//!   `Proxy-Authorization`; requests also lose `Expect`, which this hop
//!   answers itself.
//! - **`Host`** is set to the upstream's authority (`127.0.0.1:8000`), so
//!   servers that validate it against loopback names (rmcp's default
//!   `allowed_hosts`, DNS-rebinding protection in other SDKs) accept proxied
//!   requests, unless [`ProxyBuilder::preserve_host`] keeps the client's.
//!   The client's `Host` (or HTTP/2 `:authority`) is kept in
//!   `X-Forwarded-Host`.
//!   Since the upstream's own `Host` check no longer sees what the browser
//!   sent, check it in front of the proxy with
//!   [`HostLayer`](crate::protect::host::HostLayer) (the
//!   `mcp-id-guard` binary does, before the guard). `Origin` is forwarded,
//!   so Origin allow-lists keep working.
//! - **Forwarding headers** say what the proxy saw, whatever the client
//!   claimed: `X-Forwarded-For` is the client's IP (from a [`ClientAddr`]
//!   extension or [`Proxy::with_client_addr`]; removed when there is none),
//!   `X-Forwarded-Host` the client's host, `X-Forwarded-Proto` `http`, and
//!   `Forwarded` is dropped. Behind a proxy that sets them (a TLS
//!   terminator), [`ProxyBuilder::trust_forwarded`] keeps the ones a request
//!   arrives with and appends the client's IP to `X-Forwarded-For`.
//! - Requests go to the upstream over HTTP/1.1 on pooled keep-alive
//!   connections, whatever version the client used. The `Cookie` fields an
//!   HTTP/2 client split are joined with `"; "` into one (RFC 9113 §8.2.3). The task that serves a
//!   request drives its upstream connection itself (no task per connection,
//!   no hand-offs between tasks), and an answer that has already arrived is
//!   passed on in one write, head and end included.
//!
//! # Errors
//! The service never fails (`Error = Infallible`), so it works under axum and
//! hyper as is. When the upstream cannot be reached, does not accept the
//! connection within the connect timeout, or closes the connection (or sends
//! something that is not HTTP) before its response headers, the proxy logs it and answers `502 Bad Gateway`
//! with a JSON-RPC error, code `-32603`:
//!
//! ```json
//! {"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"Bad Gateway: the upstream MCP server could not be reached"}}
//! ```
//!
//! The `id` is the request's own when the proxy could read it: for a `POST`
//! with `Content-Type: application/json` whose body length is known in
//! advance (a `Content-Length`, or a body the guard already read) and at most
//! 4 MiB, the proxy reads the body whole before forwarding it (MCP POST bodies
//! are single JSON-RPC messages, which the upstream reads whole anyway). A
//! batch gets an array with one error per request. Under the guard, a remapped
//! request's id is restored in this body like in any other response. In every
//! other case (`GET`, `DELETE`, notifications, bodies of unknown length, which
//! stream through unread) the `id` is `null`.
//!
//! When every upstream connection stays busy (see
//! [`ProxyBuilder::max_connections`]) the answer is `503 Service Unavailable`
//! with code `-32000`, and when the upstream sends no response headers in
//! time, `504 Gateway Timeout` with code `-32603`; both carry the ids as
//! above.
//!
//! Statuses the upstream answers itself (404 for an unknown session, 500, ...)
//! pass through unchanged. When the upstream connection breaks after the
//! response started, the client's response is cut (not ended cleanly) so the
//! client can tell, and resume an SSE stream with `Last-Event-ID`.
//!
//! # Timeouts
//! Connecting to the upstream times out after
//! [`connect_timeout`](ProxyBuilder::connect_timeout) (5 s by default, then
//! `502`). The response headers must arrive within
//! [`response_timeout`](ProxyBuilder::response_timeout) (300 s by default,
//! then `504 Gateway Timeout` with the same JSON-RPC error carrying the
//! request's id), and a response body that sends nothing for
//! [`idle_timeout`](ProxyBuilder::idle_timeout) (300 s) is cut. There is no
//! overall request timeout: SSE streams and slow tool calls last as long as
//! the upstream keeps them alive. A client that disconnects drops the
//! upstream request, which closes that upstream connection; under the guard,
//! the request's id is released at the same moment.
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Either, Full};
use tokio::time::Instant;
use tower_service::Service;

use crate::guard::Unanswered;
use crate::wire::answer;

mod body;
mod builder;
mod capped;
mod collect;
mod connect;
mod cookie;
mod failure;
mod headers;
mod methods;
mod pool;
mod upstream;
mod warnings;

use collect::{is_peekable, read_whole};

pub use crate::protect::upstream::UpstreamFailure;
pub use body::ProxyBody;
pub use builder::ProxyBuilder;
pub use upstream::InvalidUpstream;

use failure::{error_chain, local, ErrorIds};
use pool::Pool;
use upstream::Upstream;

/// A boxed error, as [`ProxyBody`] yields and as request bodies' errors must
/// convert into: the very type of `tower::BoxError`, which users name (not
/// public here, so it has one name; `tower` is no dependency of this
/// feature).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// JSON-RPC "Internal error", the code of the proxy's `502` answers.
const INTERNAL_ERROR: i32 = -32603;

/// The default upstream connect timeout.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an idle upstream connection stays in the pool by default: below
/// the 5 s keep-alive of uvicorn and Node's HTTP server, so the proxy closes
/// an idle connection before the upstream does (a request sent on a
/// connection the upstream is closing at that moment would fail).
const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Upstream connections open at once by default (envoy's default circuit
/// breaker allows as many).
const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How long a request waits for a free upstream connection by default.
const DEFAULT_CONNECTION_WAIT: Duration = Duration::from_secs(5);

/// How long the upstream may take to send its response headers by default:
/// long enough for slow tool calls answered as plain JSON, which servers
/// send only once the tool has finished.
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long an upstream response body may go without sending anything by
/// default. rmcp and python-sdk send an SSE keep-alive comment every 15 s,
/// so a healthy stream never comes near it.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The body type the upstream client sends: a body read whole (the usual
/// JSON POST) as it is, anything else boxed.
type OutBody = Either<Full<Bytes>, UnsyncBoxBody<Bytes, BoxError>>;

/// The address of the client that sent a request, as a request extension.
///
/// Insert it into each request's extensions and the proxy names its IP in
/// `X-Forwarded-For`. Without it (and without
/// [`Proxy::with_client_addr`]), the proxy has no address to give: the
/// header is removed, or, under [`ProxyBuilder::trust_forwarded`], goes on
/// as the request arrived with it.
///
/// ```
/// use mcp_id_guard::proxy::ClientAddr;
///
/// let mut request = http::Request::new(());
/// request
///     .extensions_mut()
///     .insert(ClientAddr("127.0.0.1:50000".parse().unwrap()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub SocketAddr);

/// A [`tower_service::Service`] that forwards requests to an upstream HTTP
/// server. See the [module docs](self) for what it forwards and how.
///
/// Cloning is cheap; clones share one connection pool.
#[derive(Clone)]
pub struct Proxy {
    // One reference count per clone: tower and hyper clone the service for
    // every request (and an `Arc` per field would be a shared counter per
    // field for the cores to fight over).
    shared: Arc<Shared>,
    /// Where requests without a [`ClientAddr`] come from.
    client: Option<SocketAddr>,
}

/// What every clone of a [`Proxy`] shares.
struct Shared {
    pool: Arc<Pool>,
    upstream: Upstream,
    connect_timeout: Duration,
    preserve_host: bool,
    trust_forwarded: bool,
    response_timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
    warnings: warnings::Warnings,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("upstream", &self.shared.upstream.as_str())
            .field("connect_timeout", &self.shared.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy to `upstream` (such as `http://127.0.0.1:8000/mcp`) with the
    /// default settings.
    ///
    /// ```
    /// let proxy = mcp_id_guard::proxy::Proxy::new("http://127.0.0.1:8000/mcp")?;
    /// assert_eq!(proxy.upstream(), "http://127.0.0.1:8000/mcp");
    /// # Ok::<(), mcp_id_guard::proxy::InvalidUpstream>(())
    /// ```
    ///
    /// # Errors
    /// When `upstream` is not an absolute `http` URL, or has credentials or a
    /// query.
    pub fn new(upstream: &str) -> Result<Self, InvalidUpstream> {
        Self::builder().build(upstream)
    }

    /// A builder for a proxy with other settings.
    pub fn builder() -> ProxyBuilder {
        ProxyBuilder::default()
    }

    /// The upstream base URL, normalised (without a trailing slash).
    pub fn upstream(&self) -> &str {
        self.shared.upstream.as_str()
    }

    /// The upstream's `host:port` (port 80 when its URL names none): where
    /// its connections go, for a readiness probe.
    ///
    /// ```
    /// # use mcp_id_guard::proxy::Proxy;
    /// let proxy = Proxy::new("http://localhost/mcp")?;
    /// assert_eq!(proxy.upstream_address(), "localhost:80");
    /// # Ok::<(), mcp_id_guard::proxy::InvalidUpstream>(())
    /// ```
    pub fn upstream_address(&self) -> &str {
        self.shared.upstream.address()
    }

    /// This proxy (sharing its pool) for the requests of one client
    /// connection: those without a [`ClientAddr`] extension are taken to
    /// come from `addr`. A server that serves each connection with a clone
    /// of its own (as `hyper`'s `serve_connection` does) spares every
    /// request an extension, whose map is allocated per request.
    ///
    /// ```
    /// # use mcp_id_guard::proxy::Proxy;
    /// let proxy = Proxy::builder().build("http://127.0.0.1:8000").unwrap();
    /// let for_one_client = proxy.with_client_addr("127.0.0.1:50000".parse().unwrap());
    /// # drop(for_one_client);
    /// ```
    #[must_use]
    pub fn with_client_addr(mut self, addr: SocketAddr) -> Self {
        self.client = Some(addr);
        self
    }
}

/// Response future of [`Proxy`].
pub struct ProxyFuture {
    inner: Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>,
}

impl fmt::Debug for ProxyFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyFuture").finish_non_exhaustive()
    }
}

impl Future for ProxyFuture {
    type Output = Result<Response<ProxyBody>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B> Service<Request<B>> for Proxy
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The client queues on its pool; it is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let proxy = self.clone();
        ProxyFuture {
            inner: Box::pin(async move { Ok(proxy.forward(request).await) }),
        }
    }
}

/// A request body, and its bytes when the proxy may have to answer in the
/// upstream's place with the request's ids. A body that fails while being
/// read is answered `400` at once.
async fn read_for_stand_in<B>(
    parts: &http::request::Parts,
    body: B,
) -> Result<(OutBody, Option<Bytes>), Response<ProxyBody>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if !is_peekable(parts, &body) {
        return Ok((Either::Right(body.map_err(Into::into).boxed_unsync()), None));
    }
    match read_whole(body).await {
        Ok((body, bytes)) => Ok((body, Some(bytes))),
        Err(error) => {
            tracing::debug!(error = %error, "request body failed while being read");
            let mut response = local(
                StatusCode::BAD_REQUEST,
                &ErrorIds::Null,
                answer::INVALID_REQUEST,
                answer::UNREADABLE_MESSAGE,
            );
            response.extensions_mut().insert(Unanswered::NotSent);
            Err(response)
        }
    }
}

impl Proxy {
    async fn forward<B>(self, request: Request<B>) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let this = &*self.shared;
        let (mut parts, body) = request.into_parts();
        if let Some(response) = methods::answered_here(&parts) {
            return response;
        }
        if let Some(message) = upstream::refused(&parts) {
            tracing::debug!(method = %parts.method, "request target refused: {message}");
            let mut response = local(
                StatusCode::BAD_REQUEST,
                &ErrorIds::Null,
                answer::INVALID_REQUEST,
                message,
            );
            response.extensions_mut().insert(Unanswered::NotSent);
            return response;
        }
        // The request as sent, read only if the proxy must answer in its
        // place (most requests never need their ids read a second time).
        let (body, read) = match read_for_stand_in(&parts, body).await {
            Ok(read) => read,
            Err(response) => return response,
        };

        let client_ip = parts
            .extensions
            .get::<ClientAddr>()
            .map(|ClientAddr(addr)| addr)
            .or(self.client.as_ref())
            .map(SocketAddr::ip);
        headers::prepare_request(
            &mut parts.headers,
            this.upstream.host(),
            parts.uri.authority(),
            client_ip,
            this.preserve_host,
            this.trust_forwarded,
        );
        // An HTTP/2 client's split `Cookie` fields go as one on HTTP/1.1.
        if parts.version == Version::HTTP_2 {
            cookie::join(&mut parts.headers);
        }
        // HTTP/1.1 requests name their target in origin form.
        parts.uri = this.upstream.target(std::mem::take(&mut parts.uri));
        // For log lines, which name the whole upstream URL.
        let target = parts.uri.clone();
        let uri = this.upstream.url(&target);
        parts.version = Version::HTTP_11;
        let method = parts.method.clone();

        let deadline = this.response_timeout.map(|limit| Instant::now() + limit);
        let answered = this
            .pool
            .send(Request::from_parts(parts, body), deadline)
            .await;
        let failure = match answered {
            Ok((response, lease)) => {
                let (mut parts, body) = response.into_parts();
                headers::remove_hop_by_hop(&mut parts.headers);
                tracing::debug!(%method, %uri, status = %parts.status, "upstream answered");
                let mut body = ProxyBody::upstream(body, lease, this.idle_timeout);
                body.gather().await;
                return Response::from_parts(parts, body);
            }
            Err(failure) => failure,
        };
        this.stand_in(failure, read.as_deref(), (&method, &uri))
    }
}
