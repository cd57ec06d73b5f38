//! Harness for `tests/protocol_rmcp.rs`: a probe server on rmcp 3.11 whose
//! tool records what happens to each call (started, cancelled through its
//! `RequestContext::ct`, finished) on a log the test reads, served over
//! loopback behind zero, one or two [`IdGuardLayer`]s; and a small MCP client
//! over reqwest that can also drop a POST stream after its first event and
//! resume it with `GET` + `Last-Event-ID`.
//!
//! Ordering never relies on sleeps: the test waits for log entries, gates hold
//! calls until the test opens them, and every wait has a wall-clock bound.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http_body_util::BodyExt;
use mcp_id_guard::{IdGuardLayer, Stats};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, Implementation, ServerCapabilities, ServerConfig, ServerJsonRpcMessage,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::timeout_at;
use tokio_util::sync::CancellationToken;

/// A legacy-session revision, so the guard tracks the session.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
const ACCEPT: &str = "application/json, text/event-stream";
/// Bound for an exchange that is expected to hang (no answer).
pub const HANG_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound for an exchange that is expected to be answered.
pub const OK_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound for the test's waits on the server (log entries, stats).
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// What the server records
// ---------------------------------------------------------------------------

/// The server's own record, in order: `started:<sentinel>`,
/// `cancelled:<sentinel>` (the call's `RequestContext::ct` fired),
/// `finished:<sentinel>`, and `notified:<requestId JSON>` for every
/// `notifications/cancelled` the server handler received.
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
    pub async fn wait_for_all(&self, entries: &[&str], within: Duration) -> anyhow::Result<()> {
        let mut rx = self.0.subscribe();
        let waited = tokio::time::timeout(
            within,
            rx.wait_for(|seen| entries.iter().all(|e| seen.iter().any(|s| s == e))),
        )
        .await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            _ => bail!(
                "not recorded within {within:?}: {entries:?}; log: {:?}",
                self.snapshot()
            ),
        }
    }

    /// Waits until `entry` has been recorded.
    pub async fn wait_for(&self, entry: &str, within: Duration) -> anyhow::Result<()> {
        self.wait_for_all(&[entry], within).await
    }

    /// The entries of one call (`started:s`, `cancelled:s`, `finished:s`), in
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

    /// The `requestId` JSON texts of the cancellations the handler received.
    pub fn notified(&self) -> Vec<String> {
        self.snapshot()
            .iter()
            .filter_map(|entry| entry.strip_prefix("notified:").map(str::to_owned))
            .collect()
    }
}

/// Per-sentinel gates that held calls wait on; opening one before its call
/// arrives is fine.
#[derive(Clone, Default)]
pub struct Gates(Arc<Mutex<HashMap<String, watch::Sender<bool>>>>);

impl Gates {
    fn gate(&self, sentinel: &str) -> watch::Sender<bool> {
        let mut gates = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        gates
            .entry(sentinel.to_owned())
            .or_insert_with(|| watch::channel(false).0)
            .clone()
    }

    /// Lets the held call with this sentinel go on.
    pub fn release(&self, sentinel: &str) {
        self.gate(sentinel).send_replace(true);
    }

    async fn wait(&self, sentinel: &str) {
        let mut open = self.gate(sentinel).subscribe();
        let _ = open.wait_for(|open| *open).await;
    }
}

// ---------------------------------------------------------------------------
// The probe server
// ---------------------------------------------------------------------------

#[derive(Debug, serde::Deserialize)]
struct ProbeArgs {
    sentinel: String,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    hold: bool,
    /// Record the cancellation but keep working (a handler that cannot stop).
    #[serde(default)]
    ignore_cancel: bool,
}

/// One `tools/call` of the probe's only tool (its name does not matter).
#[derive(Debug, Clone)]
pub struct Call {
    /// Unique per server; the result text is `ECHO:<sentinel>`.
    pub sentinel: String,
    /// Work time after the gate, in milliseconds (simulated work).
    pub delay_ms: u64,
    /// Wait for [`Gates::release`] first.
    pub hold: bool,
    /// Keep working after `ct` fires.
    pub ignore_cancel: bool,
}

impl Call {
    /// A call that answers after `delay_ms`.
    pub fn new(sentinel: impl Into<String>, delay_ms: u64) -> Self {
        Self {
            sentinel: sentinel.into(),
            delay_ms,
            hold: false,
            ignore_cancel: false,
        }
    }

    /// A call that waits for its gate (and stops when cancelled).
    pub fn held(sentinel: impl Into<String>) -> Self {
        Self {
            hold: true,
            ..Self::new(sentinel, 0)
        }
    }

    /// A held call that does not stop when cancelled.
    pub fn stubborn(sentinel: impl Into<String>) -> Self {
        Self {
            ignore_cancel: true,
            ..Self::held(sentinel)
        }
    }

    /// The `tools/call` body with `id_json` written exactly as given.
    pub fn body(&self, id_json: &str) -> String {
        let arguments = serde_json::json!({
            "sentinel": self.sentinel,
            "delay_ms": self.delay_ms,
            "hold": self.hold,
            "ignore_cancel": self.ignore_cancel,
        });
        format!(
            r#"{{"jsonrpc":"2.0","id":{id_json},"method":"tools/call","params":{{"name":"probe","arguments":{arguments}}}}}"#
        )
    }
}

/// The rmcp server handler: one tool, and a record of cancellations.
#[derive(Clone)]
struct Probe {
    log: Log,
    gates: Gates,
}

impl ServerHandler for Probe {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mcp-id-guard-probe", "0.0.0"))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let args: ProbeArgs = serde_json::from_value(arguments)
            .map_err(|error| McpError::invalid_params(error.to_string(), None))?;
        let sentinel = args.sentinel;
        self.log.push(format!("started:{sentinel}"));
        let work = pin!(async {
            if args.hold {
                self.gates.wait(&sentinel).await;
            }
            if args.delay_ms > 0 {
                // Simulated work, not synchronisation.
                tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
            }
        });
        let mut work = work;
        let text = tokio::select! {
            () = &mut work => format!("ECHO:{sentinel}"),
            () = context.ct.cancelled() => {
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
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
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

/// How to build the server.
#[derive(Default)]
pub struct Setup {
    /// One endpoint per entry, all over one shared `StreamableHttpService`
    /// (clones share its session manager): behind that guard, or bare.
    pub guards: Vec<Option<IdGuardLayer>>,
    /// Give rmcp's session manager an event store (replay from the store).
    pub event_store: bool,
}

/// A running probe server.
pub struct ProbeServer {
    /// `http://127.0.0.1:<port>/mcp`, one per endpoint.
    pub urls: Vec<String>,
    /// What the tool and the handler recorded.
    pub log: Log,
    /// Gates of held calls.
    pub gates: Gates,
    /// What rmcp received (all endpoints).
    pub tap: Tap,
    /// The event store, if the setup asked for one.
    pub events: Option<MemoryEvents>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl ProbeServer {
    /// The first endpoint.
    pub fn url(&self) -> &str {
        &self.urls[0]
    }

    /// Stops the server (rmcp's sessions end, so held calls see their `ct`
    /// fire) and waits (bounded) for it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One endpoint behind `guard` (or bare).
pub async fn serve(guard: Option<IdGuardLayer>) -> anyhow::Result<ProbeServer> {
    serve_with(Setup {
        guards: vec![guard],
        event_store: false,
    })
    .await
}

/// Serves the probe with rmcp's default stateful configuration on loopback.
/// Each endpoint is `Router::new().nest_service("/mcp", tap(rmcp)).layer(guard)`.
pub async fn serve_with(setup: Setup) -> anyhow::Result<ProbeServer> {
    let shutdown = CancellationToken::new();
    let (log, gates, tap) = (Log::default(), Gates::default(), Tap::default());
    let probe = Probe {
        log: log.clone(),
        gates: gates.clone(),
    };
    let config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_cancellation_token(shutdown.child_token());
    assert!(config.legacy_session_mode, "stateful mode expected");
    let events = setup.event_store.then(MemoryEvents::default);
    let manager = match &events {
        Some(events) => LocalSessionManager::default().with_event_store(Arc::new(events.clone())),
        None => LocalSessionManager::default(),
    };
    let rmcp: StreamableHttpService<Probe, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(probe.clone()), Arc::new(manager), config);

    let mut urls = Vec::new();
    let mut tasks = Vec::new();
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
        urls.push(format!("http://{address}/mcp"));
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
        }));
    }
    Ok(ProbeServer {
        urls,
        log,
        gates,
        tap,
        events,
        shutdown,
        tasks,
    })
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// One SSE event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event {
    /// The `id:` field.
    pub id: Option<String>,
    /// The `data:` lines, joined.
    pub data: String,
    /// The `retry:` field.
    pub retry: Option<String>,
}

/// The complete events of an SSE body (those followed by a blank line).
pub fn sse_events(body: &str) -> Vec<Event> {
    let normalized = body.replace("\r\n", "\n").replace('\r', "\n");
    let mut chunks: Vec<&str> = normalized.split("\n\n").collect();
    chunks.pop();
    chunks
        .into_iter()
        .filter_map(|chunk| {
            let mut event = Event::default();
            let mut data = Vec::new();
            let mut any = false;
            for line in chunk.lines() {
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "id" => event.id = Some(value.to_owned()),
                    "data" => data.push(value.to_owned()),
                    "retry" => event.retry = Some(value.to_owned()),
                    _ => continue,
                }
                any = true;
            }
            event.data = data.join("\n");
            any.then_some(event)
        })
        .collect()
}

fn is_response(json: &str) -> bool {
    serde_json::from_str::<Value>(json).is_ok_and(|value| {
        value.is_object() && (value.get("result").is_some() || value.get("error").is_some())
    })
}

/// The exact JSON text of a message's top-level `id`.
pub fn raw_id(json: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    let envelope: Envelope<'_> = serde_json::from_str(json).ok()?;
    envelope.id.map(|id| id.get().to_owned())
}

/// One HTTP exchange as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    /// HTTP status, if headers arrived.
    pub status: Option<u16>,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `Mcp-Session-Id` of the response.
    pub session_id: Option<String>,
    /// The body read so far.
    pub body: String,
    /// The first JSON-RPC response in it (SSE event data or JSON body).
    pub response: Option<String>,
    /// The body ended before the deadline.
    pub ended: bool,
    /// A transport error.
    pub error: Option<String>,
    /// Time until the end, the deadline or the first response (eager reads).
    pub elapsed: Duration,
}

impl Exchange {
    fn is_sse(&self) -> bool {
        self.content_type
            .as_deref()
            .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"))
    }

    /// The body's complete SSE events.
    pub fn events(&self) -> Vec<Event> {
        sse_events(&self.body)
    }

    /// The body parsed as JSON (`Null` if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Reads `response` until it ends or `deadline` (or its first JSON-RPC
/// response, if `eager`).
async fn read(
    response: reqwest::Result<reqwest::Response>,
    begun: Instant,
    deadline: tokio::time::Instant,
    eager: bool,
) -> Exchange {
    let mut exchange = Exchange::default();
    let mut response = match response {
        Ok(response) => response,
        Err(error) => {
            exchange.error = Some(error.to_string());
            exchange.elapsed = begun.elapsed();
            return exchange;
        }
    };
    exchange.status = Some(response.status().as_u16());
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    exchange.content_type = header("content-type");
    exchange.session_id = header("mcp-session-id");
    let mut bytes = Vec::new();
    loop {
        match timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                bytes.extend_from_slice(&chunk);
                exchange.body = String::from_utf8_lossy(&bytes).into_owned();
                if exchange.response.is_none() && exchange.is_sse() {
                    exchange.response = exchange
                        .events()
                        .into_iter()
                        .map(|event| event.data)
                        .find(|data| is_response(data));
                    if eager && exchange.response.is_some() {
                        break;
                    }
                }
            }
            Ok(Ok(None)) => {
                exchange.ended = true;
                break;
            }
            Ok(Err(error)) => {
                exchange.error = Some(error.to_string());
                break;
            }
            Err(_) => break,
        }
    }
    if exchange.response.is_none() && exchange.ended && !exchange.is_sse() {
        let body = exchange.body.trim();
        if is_response(body) {
            exchange.response = Some(body.to_owned());
        }
    }
    exchange.elapsed = begun.elapsed();
    exchange
}

/// What a call got back.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its own result (`ECHO:<own sentinel>`) with exactly the id text sent.
    Own,
    /// Another call's result.
    Wrong {
        /// The sentinel of the result received.
        got: String,
    },
    /// No response, and the stream still open at the deadline.
    Hung,
    /// The stream ended without a JSON-RPC response.
    EndedWithoutResponse,
    /// A non-2xx answer.
    Rejected {
        /// HTTP status.
        status: u16,
    },
    /// Anything else.
    Other(String),
}

/// One call's outcome and the exchange behind it.
#[derive(Debug, Clone)]
pub struct Report {
    /// The call's sentinel.
    pub sentinel: String,
    /// The id JSON text sent.
    pub sent_id: String,
    /// The classification.
    pub outcome: Outcome,
    /// The exact JSON text of the response's `id`.
    pub answered_id: Option<String>,
    /// The raw exchange.
    pub exchange: Exchange,
}

impl Report {
    fn classify(sent_id: &str, sentinel: &str, exchange: Exchange) -> Self {
        let answered_id = exchange.response.as_deref().and_then(raw_id);
        let outcome = match (exchange.status, &exchange.response) {
            (Some(status), _) if !(200..300).contains(&status) => Outcome::Rejected { status },
            (_, Some(response)) => classify_response(sent_id, sentinel, response),
            (_, None) if exchange.error.is_some() => {
                Outcome::Other(format!("transport error: {:?}", exchange.error))
            }
            (_, None) if exchange.ended => Outcome::EndedWithoutResponse,
            (_, None) => Outcome::Hung,
        };
        Self {
            sentinel: sentinel.to_owned(),
            sent_id: sent_id.to_owned(),
            outcome,
            answered_id,
            exchange,
        }
    }
}

/// Classifies a JSON-RPC response to the call with `sentinel` and `sent_id`.
pub fn classify_response(sent_id: &str, sentinel: &str, response: &str) -> Outcome {
    let Ok(value) = serde_json::from_str::<Value>(response) else {
        return Outcome::Other(format!("unparsable response {response}"));
    };
    let Some(text) = value
        .pointer("/result/content/0/text")
        .and_then(Value::as_str)
    else {
        return Outcome::Other(format!("response without text: {response}"));
    };
    let Some(got) = text.strip_prefix("ECHO:") else {
        return Outcome::Other(format!("unexpected text: {response}"));
    };
    if got != sentinel {
        return Outcome::Wrong {
            got: got.to_owned(),
        };
    }
    match raw_id(response) {
        Some(id) if id == sent_id => Outcome::Own,
        id => Outcome::Other(format!("own result but id {id:?} instead of {sent_id}")),
    }
}

/// An initialized MCP session, reached through one endpoint.
#[derive(Clone)]
pub struct Session {
    http: reqwest::Client,
    url: String,
    id: String,
}

impl Session {
    /// `initialize` (no session header), then `notifications/initialized`.
    pub async fn open(url: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .context("building the HTTP client")?;
        let mut session = Self {
            http,
            url: url.to_owned(),
            id: String::new(),
        };
        let initialize = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "mcp-id-guard-protocol-tests", "version": "0" }
            }
        });
        let exchange = session
            .send(initialize.to_string(), None, OK_TIMEOUT, false)
            .await;
        let (Some(200), Some(id), Some(_)) =
            (exchange.status, &exchange.session_id, &exchange.response)
        else {
            bail!("initialize failed: {exchange:?}");
        };
        session.id = id.clone();
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let exchange = session.post(initialized.to_owned(), OK_TIMEOUT).await;
        if exchange.status != Some(202) {
            bail!("notifications/initialized failed: {exchange:?}");
        }
        Ok(session)
    }

    /// The same session reached through another endpoint (another replica).
    pub fn via(&self, url: &str) -> Self {
        Self {
            http: self.http.clone(),
            url: url.to_owned(),
            id: self.id.clone(),
        }
    }

    fn request(&self, body: String, session: Option<&str>) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", ACCEPT)
            .header("content-type", "application/json")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .body(body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request
    }

    async fn send(
        &self,
        body: String,
        session: Option<&str>,
        within: Duration,
        eager: bool,
    ) -> Exchange {
        let begun = Instant::now();
        let deadline = tokio::time::Instant::now() + within;
        let sent = match timeout_at(deadline, self.request(body, session).send()).await {
            Ok(sent) => sent,
            Err(_) => {
                return Exchange {
                    elapsed: begun.elapsed(),
                    ..Exchange::default()
                }
            }
        };
        read(sent, begun, deadline, eager).await
    }

    /// POSTs a raw body in this session and reads the answer to its end (or
    /// `within`).
    pub async fn post(&self, body: String, within: Duration) -> Exchange {
        self.send(body, Some(&self.id), within, false).await
    }

    /// Calls the probe tool with the id `id_json` and classifies the answer.
    pub async fn call(&self, id_json: &str, call: &Call, within: Duration) -> Report {
        let exchange = self.post(call.body(id_json), within).await;
        Report::classify(id_json, &call.sentinel, exchange)
    }

    /// POSTs `notifications/cancelled` naming `request_id_json` (exact text)
    /// and returns the exact body sent with the answer.
    pub async fn cancel(&self, request_id_json: &str) -> (String, Exchange) {
        let body = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{request_id_json}}}}}"#
        );
        let exchange = self.post(body.clone(), OK_TIMEOUT).await;
        (body, exchange)
    }

    /// POSTs a call, reads its SSE stream up to the first complete event
    /// (rmcp's priming event) and then drops the response, closing the
    /// connection: a client that lost its POST stream.
    pub async fn post_then_drop_after_first_event(
        &self,
        id_json: &str,
        call: &Call,
    ) -> anyhow::Result<(Exchange, Event)> {
        let deadline = tokio::time::Instant::now() + OK_TIMEOUT;
        let request = self.request(call.body(id_json), Some(&self.id)).send();
        let mut response = timeout_at(deadline, request).await??;
        let mut exchange = Exchange {
            status: Some(response.status().as_u16()),
            content_type: response
                .headers()
                .get("content-type")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
            ..Exchange::default()
        };
        let mut bytes = Vec::new();
        loop {
            let Some(chunk) = timeout_at(deadline, response.chunk()).await?? else {
                bail!("the stream ended before its first event: {exchange:?}");
            };
            bytes.extend_from_slice(&chunk);
            exchange.body = String::from_utf8_lossy(&bytes).into_owned();
            if let Some(first) = exchange.events().into_iter().next() {
                drop(response);
                return Ok((exchange, first));
            }
        }
    }

    /// `GET` with `Last-Event-ID` in this session: resumes a stream. Returns
    /// once the response head has arrived (rmcp answers only after the
    /// session has re-attached the stream); read it with [`Resumed::read`].
    pub async fn resume(&self, last_event_id: &str) -> anyhow::Result<Resumed> {
        let begun = Instant::now();
        let request = self
            .http
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .header("last-event-id", last_event_id)
            .send();
        let response = tokio::time::timeout(OK_TIMEOUT, request).await??;
        Ok(Resumed { response, begun })
    }
}

/// A resumed stream whose head has arrived.
pub struct Resumed {
    response: reqwest::Response,
    begun: Instant,
}

impl Resumed {
    /// Reads the stream until it ends or `within` passes.
    pub async fn read(self, within: Duration) -> Exchange {
        let deadline = tokio::time::Instant::now() + within;
        read(Ok(self.response), self.begun, deadline, false).await
    }
}

/// Polls `layer.stats()` until `done` holds or `within` passes (the guard
/// releases a request when the server side of its exchange ends, which may
/// trail what the client sees); returns the last snapshot.
pub async fn stats_when(
    layer: &IdGuardLayer,
    within: Duration,
    mut done: impl FnMut(&Stats) -> bool,
) -> Stats {
    let deadline = Instant::now() + within;
    loop {
        let stats = layer.stats();
        if done(&stats) || Instant::now() >= deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts that nothing is in flight and no session is tracked (bounded wait).
pub async fn assert_drained(layer: &IdGuardLayer) -> Stats {
    let stats = stats_when(layer, WAIT_TIMEOUT, |stats| {
        stats.in_flight_requests == 0 && stats.tracked_sessions == 0
    })
    .await;
    assert_eq!(
        (stats.in_flight_requests, stats.tracked_sessions),
        (0, 0),
        "every request must be released: {stats:?}"
    );
    stats
}

/// Asserts a call got its own result with exactly the id text sent.
#[track_caller]
pub fn assert_own(report: &Report) {
    assert_eq!(
        report.outcome,
        Outcome::Own,
        "{}: expected its own result: {report:#?}",
        report.sentinel
    );
    assert_eq!(
        report.answered_id.as_deref(),
        Some(report.sent_id.as_str()),
        "{}: the id must come back byte for byte",
        report.sentinel
    );
}
