//! The servers the tests talk to: an rmcp 3.11 echo server on loopback
//! (bare, behind one or more guards, or as the proxy's upstream), and hyper
//! serving any tower service as the `mcp-id-guard` binary does.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::bail;
use bytes::Bytes;
use http_body_util::BodyExt;
use mcp_id_guard::IdGuardLayer;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CancelledNotificationParam, Implementation, ServerCapabilities, ServerConfig,
    ServerJsonRpcMessage,
};
use rmcp::service::NotificationContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::OK_TIMEOUT;

// ---------------------------------------------------------------------------
// What the server records, and the gates the test opens
// ---------------------------------------------------------------------------

/// The server's own record, in order: `started:<sentinel>`,
/// `cancelled:<sentinel>` (the call's cancellation token fired),
/// `finished:<sentinel>`, and `notified:<requestId JSON>` for every
/// `notifications/cancelled` the handler received.
#[derive(Clone)]
pub struct Log(Arc<watch::Sender<Vec<String>>>);

impl Default for Log {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(Vec::new())))
    }
}

impl Log {
    fn push(&self, entry: String) {
        self.0.send_modify(|entries| entries.push(entry));
    }

    /// Everything recorded so far.
    pub fn snapshot(&self) -> Vec<String> {
        self.0.borrow().clone()
    }

    /// Whether `entry` was recorded.
    pub fn contains(&self, entry: &str) -> bool {
        self.0.borrow().iter().any(|seen| seen == entry)
    }

    /// Waits until every entry in `entries` has been recorded.
    pub async fn wait_for_all<S: AsRef<str>>(
        &self,
        entries: &[S],
        within: Duration,
    ) -> anyhow::Result<()> {
        let mut rx = self.0.subscribe();
        let recorded = |seen: &Vec<String>| {
            entries
                .iter()
                .all(|entry| seen.iter().any(|s| s == entry.as_ref()))
        };
        let waited = tokio::time::timeout(within, rx.wait_for(recorded))
            .await
            .map(|recorded| recorded.is_ok());
        match waited {
            Ok(true) => Ok(()),
            _ => {
                let missing: Vec<&str> = entries
                    .iter()
                    .map(AsRef::as_ref)
                    .filter(|entry| !self.contains(entry))
                    .collect();
                bail!(
                    "not recorded within {within:?}: {missing:?}; log: {:?}",
                    self.snapshot()
                )
            }
        }
    }

    /// Waits until `entry` has been recorded.
    pub async fn wait_for(&self, entry: &str, within: Duration) -> anyhow::Result<()> {
        self.wait_for_all(&[entry], within).await
    }

    /// The entries of one call (`started`, `cancelled`, `finished`), in
    /// order, without the sentinel.
    pub fn of(&self, sentinel: &str) -> Vec<String> {
        self.snapshot()
            .iter()
            .filter_map(|entry| {
                let (kind, rest) = entry.split_once(':')?;
                (rest == sentinel && kind != "notified").then(|| kind.to_owned())
            })
            .collect()
    }

    /// The sentinels of the calls that entered the tool, in order.
    pub fn started(&self) -> Vec<String> {
        self.snapshot()
            .iter()
            .filter_map(|entry| entry.strip_prefix("started:").map(str::to_owned))
            .collect()
    }

    /// The `requestId` JSON texts of the cancellations the handler received.
    pub fn notified(&self) -> Vec<String> {
        self.snapshot()
            .iter()
            .filter_map(|entry| entry.strip_prefix("notified:").map(str::to_owned))
            .collect()
    }
}

/// The log read by sentinel: a bare sentinel stands for `started:<sentinel>`;
/// `finished:…` and `cancelled:…` are looked up as written.
#[derive(Clone)]
pub struct Started(Log);

impl Started {
    fn entry(sentinel: &str) -> String {
        if sentinel.starts_with("finished:") || sentinel.starts_with("cancelled:") {
            sentinel.to_owned()
        } else {
            format!("started:{sentinel}")
        }
    }

    /// Waits until the call with `sentinel` has entered the tool.
    pub async fn wait_for(&self, sentinel: &str, within: Duration) -> anyhow::Result<()> {
        self.wait_for_all(&[sentinel], within).await
    }

    /// Waits until every call in `sentinels` has entered the tool.
    pub async fn wait_for_all<S: AsRef<str>>(
        &self,
        sentinels: &[S],
        within: Duration,
    ) -> anyhow::Result<()> {
        let entries: Vec<String> = sentinels
            .iter()
            .map(|sentinel| Self::entry(sentinel.as_ref()))
            .collect();
        self.0.wait_for_all(&entries, within).await
    }

    /// Every sentinel that has entered the tool so far, in order.
    pub async fn seen(&self) -> Vec<String> {
        self.0.started()
    }
}

/// Per-sentinel gates that held calls wait on. A gate opened before its call
/// arrives stays open.
#[derive(Debug, Clone, Default)]
pub struct Gates(Arc<Mutex<HashMap<String, watch::Sender<bool>>>>);

impl Gates {
    fn gates(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<bool>>> {
        self.0.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn gate(&self, sentinel: &str) -> watch::Sender<bool> {
        self.gates()
            .entry(sentinel.to_owned())
            .or_insert_with(|| watch::channel(false).0)
            .clone()
    }

    /// Makes the call with `sentinel` park in the tool until released, even
    /// if the call does not ask to be held (for clients that cannot say so).
    pub fn hold(&self, sentinel: &str) {
        self.gates()
            .insert(sentinel.to_owned(), watch::channel(false).0);
    }

    /// Lets the held call with this sentinel go on (now or when it arrives).
    pub fn release(&self, sentinel: &str) {
        self.gate(sentinel).send_replace(true);
    }

    fn has(&self, sentinel: &str) -> bool {
        self.gates().contains_key(sentinel)
    }

    async fn wait(&self, sentinel: &str) {
        let mut open = self.gate(sentinel).subscribe();
        // The sender lives in the map, so the channel never closes.
        let _ = open.wait_for(|open| *open).await;
    }
}

// ---------------------------------------------------------------------------
// The echo server
// ---------------------------------------------------------------------------

fn yes() -> bool {
    true
}

/// Arguments of the `echo` tool.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct EchoArgs {
    /// Answered as `ECHO:<sentinel>`; keys the log entries and the gate.
    pub sentinel: String,
    /// Simulated work after the gate, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Park until the test opens this call's gate.
    #[serde(default)]
    pub hold: bool,
    /// Keep working when cancelled, as many real tools do (the default); if
    /// false, answer `CANCELLED:<sentinel>` at once.
    #[serde(default = "yes")]
    pub ignore_cancel: bool,
}

/// rmcp's per-session handler: one tool, `echo`, and a record of the
/// cancellations the handler is told about. All instances of one
/// [`McpServer`] share the log and the gates.
#[derive(Clone)]
pub struct EchoServer {
    tool_router: ToolRouter<Self>,
    log: Log,
    gates: Gates,
}

#[tool_router]
impl EchoServer {
    /// Records `started`, waits for its gate if held, works `delay_ms`,
    /// records `finished` and answers `ECHO:<sentinel>`. A cancellation is
    /// recorded as `cancelled`; the call then goes on or stops as asked.
    #[tool(description = "Answers ECHO:<sentinel>")]
    async fn echo(
        &self,
        Parameters(args): Parameters<EchoArgs>,
        cancelled: CancellationToken,
    ) -> String {
        let sentinel = args.sentinel;
        self.log.push(format!("started:{sentinel}"));
        let held = args.hold || self.gates.has(&sentinel);
        let work = async {
            if held {
                self.gates.wait(&sentinel).await;
            }
            if args.delay_ms > 0 {
                // Simulated work, not synchronisation.
                tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
            }
        };
        tokio::pin!(work);
        let text = tokio::select! {
            () = &mut work => format!("ECHO:{sentinel}"),
            () = cancelled.cancelled() => {
                self.log.push(format!("cancelled:{sentinel}"));
                if args.ignore_cancel {
                    work.await;
                    format!("ECHO:{sentinel}")
                } else {
                    format!("CANCELLED:{sentinel}")
                }
            }
        };
        self.log.push(format!("finished:{sentinel}"));
        text
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mcp-id-guard-echo", "0.0.0"))
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        let id = notification
            .request_id
            .map_or_else(|| "none".to_owned(), |id| json_text(&id));
        self.log.push(format!("notified:{id}"));
    }
}

fn json_text<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

// ---------------------------------------------------------------------------
// What rmcp received, and what it emitted
// ---------------------------------------------------------------------------

/// What the inner server (rmcp) received, in order: method and body bytes,
/// recorded by a tap between the guard and rmcp.
#[derive(Clone, Default)]
pub struct Tap(Arc<Mutex<Vec<(http::Method, Bytes)>>>);

impl Tap {
    /// The POST bodies rmcp received, as text.
    pub fn posted(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .iter()
            .filter(|(method, _)| method == http::Method::POST)
            .map(|(_, body)| String::from_utf8_lossy(body).into_owned())
            .collect()
    }
}

/// Records each request's body, then hands it to `inner`.
#[derive(Clone)]
struct Tapped<S> {
    inner: S,
    tap: Tap,
}

impl<S> tower_service::Service<http::Request<axum::body::Body>> for Tapped<S>
where
    S: tower_service::Service<http::Request<axum::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<axum::body::Body>) -> Self::Future {
        let (mut inner, tap) = (self.inner.clone(), self.tap.clone());
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .unwrap_or_default();
            tap.0
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .push((parts.method.clone(), bytes.clone()));
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner
                .call(http::Request::from_parts(
                    parts,
                    axum::body::Body::from(bytes),
                ))
                .await
        })
    }
}

/// An in-memory [`EventStore`] (ids `ev-<n>`, unique across streams) that the
/// test can look into: it holds exactly what rmcp emitted, before any guard.
#[derive(Clone, Default)]
pub struct MemoryEvents {
    events: Arc<watch::Sender<Vec<(String, ServerSseMessage)>>>,
    next: Arc<AtomicU64>,
}

impl MemoryEvents {
    /// Every stored event on the stream of `event_id` after it: its id and
    /// the JSON text of its message.
    pub fn stored_after(&self, event_id: &str) -> Vec<(String, String)> {
        let events = self.events.borrow();
        after(&events, event_id)
            .filter_map(|event| {
                let message = event.message.as_deref().map(json_text)?;
                Some((event.event_id.clone().unwrap_or_default(), message))
            })
            .collect()
    }

    /// Waits until a JSON-RPC response has been stored on the stream of
    /// `event_id`, after it.
    pub async fn wait_for_response_after(
        &self,
        event_id: &str,
        within: Duration,
    ) -> anyhow::Result<()> {
        let mut rx = self.events.subscribe();
        let stored = tokio::time::timeout(
            within,
            rx.wait_for(|events| {
                after(events, event_id).any(|event| {
                    matches!(
                        event.message.as_deref(),
                        Some(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))
                    )
                })
            }),
        )
        .await;
        match stored {
            Ok(Ok(_)) => Ok(()),
            _ => bail!("no response stored after {event_id} within {within:?}"),
        }
    }
}

fn after<'a>(
    events: &'a [(String, ServerSseMessage)],
    event_id: &str,
) -> impl Iterator<Item = &'a ServerSseMessage> {
    let position = events
        .iter()
        .position(|(_, event)| event.event_id.as_deref() == Some(event_id));
    let stream = position.map(|index| events[index].0.clone());
    events
        .iter()
        .skip(position.map_or(events.len(), |index| index + 1))
        .filter(move |(stream_id, _)| Some(stream_id) == stream.as_ref())
        .map(|(_, event)| event)
}

// `EventStore` is an `async_trait` trait; written out by hand, as the macro
// would, to avoid a dev-dependency on `async-trait`.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl EventStore for MemoryEvents {
    fn store_event<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        stream_id: &'life1 str,
        event: &'life2 ServerSseMessage,
    ) -> BoxFuture<'async_trait, Result<String, EventStoreError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let event_id = format!("ev-{}", self.next.fetch_add(1, Ordering::Relaxed));
            let mut event = event.clone();
            event.event_id = Some(event_id.clone());
            self.events
                .send_modify(|events| events.push((stream_id.to_owned(), event)));
            Ok(event_id)
        })
    }

    fn replay_events_after<'life0, 'life1, 'async_trait>(
        &'life0 self,
        last_event_id: &'life1 str,
    ) -> BoxFuture<'async_trait, Result<EventStream, EventStoreError>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let replay: Vec<ServerSseMessage> = {
                let events = self.events.borrow();
                if !events
                    .iter()
                    .any(|(_, event)| event.event_id.as_deref() == Some(last_event_id))
                {
                    return Err(std::io::Error::other("unknown event id").into());
                }
                after(&events, last_event_id).cloned().collect()
            };
            let stream: EventStream = Box::pin(futures::stream::iter(replay));
            Ok(stream)
        })
    }
}

// ---------------------------------------------------------------------------
// Serving the echo server
// ---------------------------------------------------------------------------

/// How to build the server.
pub struct Setup {
    /// One endpoint per entry, all over one shared `StreamableHttpService`
    /// (clones share its session manager): behind that guard, or bare.
    pub guards: Vec<Option<IdGuardLayer>>,
    /// Give rmcp's session manager an event store (replay from the store).
    pub event_store: bool,
    /// rmcp's SSE keep-alive interval (`None`: no keep-alive comments).
    pub sse_keep_alive: Option<Duration>,
}

impl Default for Setup {
    /// One bare endpoint with rmcp's default keep-alive (15 s).
    fn default() -> Self {
        Self {
            guards: vec![None],
            event_store: false,
            sse_keep_alive: Some(Duration::from_secs(15)),
        }
    }
}

/// A running echo server on `127.0.0.1:<ephemeral>`.
pub struct McpServer {
    /// `http://127.0.0.1:<port>/mcp` of the first endpoint.
    pub url: String,
    /// `http://127.0.0.1:<port>` of the first endpoint: a proxy's upstream.
    pub base: String,
    /// `http://127.0.0.1:<port>/mcp`, one per endpoint.
    pub urls: Vec<String>,
    /// What the tool and the handler recorded.
    pub log: Log,
    /// The same record, read by sentinel.
    pub started: Started,
    /// Gates of held calls.
    pub gates: Gates,
    /// What rmcp received (all endpoints).
    pub tap: Tap,
    /// The event store, if the setup asked for one.
    pub events: Option<MemoryEvents>,
    /// Cancelling it stops the server and terminates rmcp's sessions.
    pub shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl McpServer {
    /// The first endpoint.
    pub fn url(&self) -> &str {
        &self.urls[0]
    }

    /// Waits (up to `OK_TIMEOUT`) until every call in `sentinels` has entered
    /// the tool (or, for `finished:<sentinel>`, has returned its result).
    pub async fn wait_started<S: AsRef<str>>(&self, sentinels: &[S]) -> anyhow::Result<()> {
        self.started.wait_for_all(sentinels, OK_TIMEOUT).await
    }

    /// The sentinels that have entered the tool so far.
    pub async fn started_so_far(&self) -> Vec<String> {
        self.log.started()
    }

    /// Stops the server (rmcp's sessions end, so held calls see their
    /// cancellation) and waits (bounded) for it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One endpoint behind `guard` (or bare), with rmcp's default stateful
/// configuration, as the crate documents:
/// `Router::new().nest_service("/mcp", rmcp).layer(guard)`.
pub async fn serve(guard: Option<IdGuardLayer>) -> anyhow::Result<McpServer> {
    serve_with(Setup {
        guards: vec![guard],
        ..Setup::default()
    })
    .await
}

/// A bare server without keep-alive comments: the proxy's upstream.
pub async fn upstream() -> anyhow::Result<McpServer> {
    serve_with(Setup {
        sse_keep_alive: None,
        ..Setup::default()
    })
    .await
}

/// Serves the echo server on loopback as `setup` says. Each endpoint is
/// `Router::new().nest_service("/mcp", tap(rmcp)).layer(guard)`.
pub async fn serve_with(setup: Setup) -> anyhow::Result<McpServer> {
    let shutdown = CancellationToken::new();
    let (log, gates, tap) = (Log::default(), Gates::default(), Tap::default());
    let handler = EchoServer {
        tool_router: EchoServer::tool_router(),
        log: log.clone(),
        gates: gates.clone(),
    };
    let config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(setup.sse_keep_alive)
        .with_cancellation_token(shutdown.child_token());
    assert!(config.legacy_session_mode, "stateful mode expected");
    let events = setup.event_store.then(MemoryEvents::default);
    let manager = match &events {
        Some(events) => LocalSessionManager::default().with_event_store(Arc::new(events.clone())),
        None => LocalSessionManager::default(),
    };
    let rmcp: StreamableHttpService<EchoServer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(handler.clone()), Arc::new(manager), config);

    let mut urls = Vec::new();
    let mut tasks = Vec::new();
    let mut base = String::new();
    for guard in setup.guards {
        let tapped = Tapped {
            inner: rmcp.clone(),
            tap: tap.clone(),
        };
        let router = axum::Router::new().nest_service("/mcp", tapped);
        let router = match guard {
            Some(layer) => router.layer(layer),
            None => router,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        if urls.is_empty() {
            base = format!("http://{address}");
        }
        urls.push(format!("http://{address}/mcp"));
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
        }));
    }
    Ok(McpServer {
        url: urls[0].clone(),
        base,
        urls,
        started: Started(log.clone()),
        log,
        gates,
        tap,
        events,
        shutdown,
        tasks,
    })
}

/// A free loopback port (bound, then released), for a server the test
/// starts on it.
pub fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A loopback port whose connections are refused for as long as this lives:
/// it stays bound without listening. A port bound and then released (see
/// [`dead_port`]) can be taken meanwhile by another test's listener, or be
/// picked as a connection's own source port and connect to itself; this one
/// cannot.
#[allow(dead_code)] // Not every test binary that includes the harness uses it.
pub struct RefusedPort {
    _socket: tokio::net::TcpSocket,
    pub port: u16,
}

/// See [`RefusedPort`].
#[allow(dead_code)]
pub fn refused_port() -> RefusedPort {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let port = socket.local_addr().expect("addr").port();
    RefusedPort {
        _socket: socket,
        port,
    }
}

// Only the proxy tests use these; the other binaries compile the harness whole.
#[cfg(feature = "proxy")]
#[allow(unused_imports)]
pub use self::hyper_serving::{serve_proxy, serve_service, Served};

#[cfg(feature = "proxy")]
mod hyper_serving {
    use std::convert::Infallible;
    use std::future::poll_fn;
    use std::net::SocketAddr;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response};
    use http_body::Body;
    use hyper::body::Incoming;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use mcp_id_guard::proxy::{ClientAddr, Proxy};
    use mcp_id_guard::IdGuardLayer;
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;
    use tower::BoxError;
    use tower_layer::Layer;
    use tower_service::Service;

    /// A server on `127.0.0.1:<ephemeral>`; stops accepting when dropped.
    pub struct Served {
        /// Where it listens.
        pub addr: SocketAddr,
        accept: JoinHandle<()>,
    }

    impl Drop for Served {
        fn drop(&mut self) {
            self.accept.abort();
        }
    }

    /// Serves `service` with hyper-util's auto (HTTP/1.1 + h2c) server, as
    /// the binary does, putting the peer address into every request as
    /// [`ClientAddr`].
    pub async fn serve_service<S, B>(service: S) -> anyhow::Result<Served>
    where
        S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let accept = tokio::spawn(async move {
            let server = auto::Builder::new(TokioExecutor::new());
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let service = service.clone();
                let per_request =
                    hyper::service::service_fn(move |mut request: Request<Incoming>| {
                        request.extensions_mut().insert(ClientAddr(peer));
                        let mut service = service.clone();
                        async move {
                            poll_fn(|cx| service.poll_ready(cx)).await?;
                            service.call(request).await
                        }
                    });
                let connection = server
                    .serve_connection(TokioIo::new(stream), per_request)
                    .into_owned();
                tokio::spawn(connection);
            }
        });
        Ok(Served { addr, accept })
    }

    /// The guarded proxy to `upstream`, served on loopback.
    pub async fn serve_proxy(upstream: &str, guard: &IdGuardLayer) -> anyhow::Result<Served> {
        let proxy = Proxy::builder()
            .connect_timeout(Duration::from_secs(2))
            .build(upstream)?;
        serve_service(guard.layer(proxy)).await
    }
}
