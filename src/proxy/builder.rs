//! [`ProxyBuilder`]: the proxy's settings, each with its default and why.

use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

use super::connect::Connector;
use super::pool::Pool;
use super::upstream::{InvalidUpstream, Upstream};
use super::{
    warnings, BoxError, Proxy, Shared, DEFAULT_CONNECTION_WAIT, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_POOL_IDLE_TIMEOUT,
    DEFAULT_RESPONSE_TIMEOUT,
};

/// Settings of a [`Proxy`].
///
/// ```
/// use std::time::Duration;
/// use mcp_id_guard::proxy::Proxy;
///
/// let proxy = Proxy::builder()
///     .connect_timeout(Duration::from_secs(2))
///     .pool_idle_timeout(Duration::from_secs(30))
///     .build("http://localhost:3000/mcp")?;
/// # let _ = proxy;
/// # Ok::<(), mcp_id_guard::proxy::InvalidUpstream>(())
/// ```
#[derive(Debug, Clone)]
pub struct ProxyBuilder {
    connect_timeout: Duration,
    pool_idle_timeout: Duration,
    preserve_host: bool,
    trust_forwarded: bool,
    response_timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
    max_connections: Option<usize>,
    connection_wait: Duration,
    /// `None`: TCP (hyper-util's `HttpConnector`).
    connector: Option<Connector>,
}

impl Default for ProxyBuilder {
    fn default() -> Self {
        Self {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
            preserve_host: false,
            trust_forwarded: false,
            response_timeout: Some(DEFAULT_RESPONSE_TIMEOUT),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            max_connections: Some(DEFAULT_MAX_CONNECTIONS),
            connection_wait: DEFAULT_CONNECTION_WAIT,
            connector: None,
        }
    }
}

impl ProxyBuilder {
    /// How long to wait for the upstream to accept a connection before
    /// answering `502` (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long an idle upstream connection stays in the pool (default 4 s:
    /// below the 5 s keep-alive of uvicorn and Node's HTTP server, so the
    /// proxy, not the upstream, closes idle connections, and a request is
    /// never sent on a connection the upstream is closing).
    pub fn pool_idle_timeout(mut self, timeout: Duration) -> Self {
        self.pool_idle_timeout = timeout;
        self
    }

    /// The most upstream connections open at once, idle pooled ones included
    /// (default 1024; `None` for no cap). A request that finds them all busy
    /// waits up to [`connection_wait`](Self::connection_wait) for one, then
    /// gets `503 Service Unavailable` with a JSON-RPC `-32000` error carrying
    /// its id. Each open SSE stream holds a connection.
    pub fn max_connections(mut self, max: Option<usize>) -> Self {
        self.max_connections = max;
        self
    }

    /// How long a request waits for a free upstream connection under
    /// [`max_connections`](Self::max_connections) (default 5 s).
    pub fn connection_wait(mut self, wait: Duration) -> Self {
        self.connection_wait = wait;
        self
    }

    /// How long the upstream may take to answer a request with its response
    /// headers (default 300 s; `None` waits for ever). Past it, the client
    /// gets `504 Gateway Timeout` with a JSON-RPC `-32603` error carrying its
    /// request id (as for `502`, see the [module docs](crate::proxy)).
    ///
    /// Servers that stream (SSE) send their headers at once, so this bounds
    /// only servers that answer a tool call with plain JSON: they send the
    /// headers when the tool has finished. Set it above your longest tool
    /// call.
    pub fn response_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long an upstream response body may send nothing (default 300 s;
    /// `None` waits for ever). Past it, the client's response is cut, as
    /// when the upstream connection breaks, and the upstream request is
    /// dropped. Every frame counts as activity, SSE keep-alive comments
    /// included, so a healthy stream from a server that sends them (rmcp,
    /// python-sdk: every 15 s) is never cut. A server that sends none cuts
    /// quiet streams after this long; MCP clients reconnect GET streams.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Forwards the client's `Host` (or HTTP/2 `:authority`) to the upstream
    /// unchanged instead of the upstream's own authority (default `false`), so
    /// the upstream's own `Host` check keeps working as a second layer behind
    /// [`HostPolicy`](crate::protect::host::HostPolicy). The upstream must then accept the names clients use.
    pub fn preserve_host(mut self, enabled: bool) -> Self {
        self.preserve_host = enabled;
        self
    }

    /// Trusts the forwarding headers a request arrives with (default
    /// `false`): `X-Forwarded-Host`, `X-Forwarded-Proto` and `Forwarded` pass
    /// unchanged and the client's address is appended to `X-Forwarded-For`,
    /// as nginx's `$proxy_add_x_forwarded_for` does. Turn it on only when
    /// every request comes through a proxy that sets them (a TLS
    /// terminator, a load balancer). Off, the proxy is the first hop the
    /// upstream can believe (Envoy's `use_remote_address` with no trusted
    /// hops): `X-Forwarded-For` is the client's address alone,
    /// `X-Forwarded-Host` the host the client named, `X-Forwarded-Proto`
    /// `http`, and `Forwarded` is dropped, so a client cannot make an
    /// upstream that believes them see another address, host or scheme.
    ///
    /// ```
    /// use mcp_id_guard::proxy::Proxy;
    ///
    /// // Behind a TLS terminator that sets X-Forwarded-Proto: https.
    /// let proxy = Proxy::builder()
    ///     .trust_forwarded(true)
    ///     .build("http://127.0.0.1:8000")?;
    /// # let _ = proxy;
    /// # Ok::<(), mcp_id_guard::proxy::InvalidUpstream>(())
    /// ```
    pub fn trust_forwarded(mut self, enabled: bool) -> Self {
        self.trust_forwarded = enabled;
        self
    }

    /// Opens upstream connections with `connector` instead of TCP: a
    /// [`tower_service::Service`] that takes the upstream's base URI
    /// (`http://host:port/`) and returns a connection's byte stream, as
    /// hyper-util's connectors do. For a Unix socket, a tunnel, or a
    /// simulated network. (An `Arc` around `C` if it is costly to clone:
    /// each connection is opened by a clone of it.)
    ///
    /// The proxy's bounds hold through it: the
    /// [connect timeout](Self::connect_timeout) (then `502`), the
    /// [connection cap](Self::max_connections), the pool's idle timeout,
    /// and the response and idle timeouts. Options of the TCP connector
    /// (`TCP_NODELAY`, keep-alive) are the connector's to set.
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::Pin;
    /// use std::task::{Context, Poll};
    /// use hyper_util::rt::TokioIo;
    /// use mcp_id_guard::proxy::Proxy;
    ///
    /// /// Every upstream connection goes to one Unix socket, whatever the URI.
    /// #[derive(Clone)]
    /// struct UnixConnector(&'static str);
    ///
    /// impl tower_service::Service<http::Uri> for UnixConnector {
    ///     type Response = TokioIo<tokio::net::UnixStream>;
    ///     type Error = std::io::Error;
    ///     type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;
    ///
    ///     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    ///         Poll::Ready(Ok(()))
    ///     }
    ///
    ///     fn call(&mut self, _upstream: http::Uri) -> Self::Future {
    ///         let path = self.0;
    ///         Box::pin(async move { Ok(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) })
    ///     }
    /// }
    ///
    /// let proxy = Proxy::builder()
    ///     .connector(UnixConnector("/run/mcp.sock"))
    ///     .build("http://localhost/mcp")?;
    /// # let _ = proxy;
    /// # Ok::<(), mcp_id_guard::proxy::InvalidUpstream>(())
    /// ```
    pub fn connector<C>(mut self, connector: C) -> Self
    where
        C: Service<Uri> + Clone + Send + Sync + 'static,
        C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
        C::Error: Into<BoxError>,
        C::Future: Send + 'static,
    {
        // The timeout is the builder's at `build`, whichever order the
        // calls come in.
        self.connector = Some(Connector::custom(connector, Duration::ZERO));
        self
    }

    /// The proxy to `upstream`. Needs no runtime; requests must be sent from
    /// within a Tokio runtime.
    ///
    /// # Errors
    /// When `upstream` is not an absolute `http` URL, or has credentials or a
    /// query.
    pub fn build(self, upstream: &str) -> Result<Proxy, InvalidUpstream> {
        let upstream = Upstream::parse(upstream)?;
        let connector = match self.connector {
            Some(connector) => connector.with_timeout(self.connect_timeout),
            None => {
                let mut connector = HttpConnector::new();
                connector.set_connect_timeout(Some(self.connect_timeout));
                // Small SSE events and JSON bodies must not wait for Nagle.
                connector.set_nodelay(true);
                connector.set_keepalive(Some(Duration::from_secs(60)));
                Connector::Http(connector)
            }
        };
        let pool = Arc::new(Pool::new(
            connector,
            upstream.base(),
            self.max_connections,
            self.connection_wait,
            self.pool_idle_timeout,
        ));
        Ok(Proxy {
            client: None,
            shared: Arc::new(Shared {
                pool,
                upstream,
                connect_timeout: self.connect_timeout,
                preserve_host: self.preserve_host,
                trust_forwarded: self.trust_forwarded,
                response_timeout: self.response_timeout,
                idle_timeout: self.idle_timeout,
                warnings: warnings::Warnings::default(),
            }),
        })
    }
}
