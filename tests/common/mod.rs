//! Shared harness for the real-server tests and the demo: an rmcp 3.11 echo
//! server served over loopback (bare or behind [`IdGuardLayer`]), and a real
//! HTTP client that speaks MCP streamable HTTP (legacy sessions) and reports
//! what each `tools/call` got back.
//!
//! Ordering between the test and the server never relies on sleeps: the echo
//! tool reports `started` on a channel before doing anything else, and a call
//! made with `hold: true` parks on a per-sentinel gate until the test opens
//! it. Every wait is bounded by a wall-clock deadline.

// This module is compiled into several targets (`tests/real_rmcp.rs` and, via
// `#[path]`, `examples/demo.rs`); each uses a different subset of it, so
// unused-item warnings would only be noise.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use mcp_id_guard::{IdGuardLayer, Stats};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::timeout_at;
use tokio_util::sync::CancellationToken;

/// The protocol revision the client negotiates: a legacy-session revision, so
/// the guard tracks the session's requests.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// The `Accept` header every POST must carry (rmcp answers 406 otherwise).
pub const ACCEPT: &str = "application/json, text/event-stream";
/// How long a call may go without its response before it counts as hung.
/// rmcp's SSE keep-alive (15 s) would defeat a read timeout; this bound is a
/// wall-clock deadline over the whole exchange.
pub const HANG_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound for calls that are expected to succeed: generous, so a loaded machine
/// does not turn a slow answer into a false "hung".
pub const OK_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound for the test's own waits on the server (started signals, stats).
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// The echo server
// ---------------------------------------------------------------------------

/// Arguments of the `echo` tool.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct EchoArgs {
    /// Returned as `ECHO:<sentinel>`; also the key of the started signal and
    /// of the hold gate.
    pub sentinel: String,
    /// Work time after the gate opens, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Park until the test calls [`Gates::release`] for this sentinel.
    #[serde(default)]
    pub hold: bool,
}

/// Per-sentinel gates that held calls wait on. Opening a gate before the call
/// arrives is fine: it stays open.
#[derive(Debug, Clone, Default)]
pub struct Gates(Arc<Mutex<HashMap<String, watch::Sender<bool>>>>);

impl Gates {
    fn gate(&self, sentinel: &str) -> watch::Sender<bool> {
        let mut gates = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        gates
            .entry(sentinel.to_owned())
            .or_insert_with(|| watch::channel(false).0)
            .clone()
    }

    /// Lets the held call with this sentinel go on (now or when it arrives).
    pub fn release(&self, sentinel: &str) {
        self.gate(sentinel).send_replace(true);
    }

    async fn wait(&self, sentinel: &str) {
        let mut open = self.gate(sentinel).subscribe();
        // The sender lives in the map, so the channel never closes.
        let _ = open.wait_for(|open| *open).await;
    }
}

/// An rmcp server with one tool, `echo`. One instance per session (rmcp's
/// factory builds it); all instances of one [`TestServer`] share the started
/// channel and the gates.
#[derive(Clone)]
pub struct EchoServer {
    tool_router: ToolRouter<Self>,
    started: mpsc::UnboundedSender<String>,
    gates: Gates,
}

#[tool_router]
impl EchoServer {
    /// Reports `started`, waits for its gate if held, works `delay_ms`, and
    /// answers `ECHO:<sentinel>`, reporting `finished:<sentinel>` just before.
    /// Like many real tools it does not stop when cancelled: a cancellation
    /// while held is only reported (as `cancelled:<sentinel>`), and the call
    /// still answers once released.
    #[tool(description = "Echo a sentinel back as ECHO:<sentinel>")]
    async fn echo(
        &self,
        Parameters(args): Parameters<EchoArgs>,
        cancelled: CancellationToken,
    ) -> String {
        let _ = self.started.send(args.sentinel.clone());
        if args.hold {
            let gate = self.gates.wait(&args.sentinel);
            tokio::pin!(gate);
            tokio::select! {
                () = &mut gate => {}
                () = cancelled.cancelled() => {
                    let _ = self.started.send(format!("cancelled:{}", args.sentinel));
                    gate.await;
                }
            }
        }
        if args.delay_ms > 0 {
            // Simulated work, not synchronisation.
            tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
        }
        let _ = self.started.send(format!("finished:{}", args.sentinel));
        format!("ECHO:{}", args.sentinel)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mcp-id-guard-echo", "0.0.0"))
    }
}

/// The test's end of the started channel. Remembers every sentinel seen, so
/// the order in which the test waits does not matter. The tool also reports
/// `finished:<sentinel>` when it returns and `cancelled:<sentinel>` when a
/// held call is cancelled.
#[derive(Debug)]
pub struct Started {
    inner: tokio::sync::Mutex<(mpsc::UnboundedReceiver<String>, Vec<String>)>,
}

impl Started {
    /// Waits until the call with `sentinel` has entered the tool, or fails
    /// after `within`.
    pub async fn wait_for(&self, sentinel: &str, within: Duration) -> anyhow::Result<()> {
        self.wait_for_all(&[sentinel], within).await
    }

    /// Waits until every call in `sentinels` has entered the tool.
    pub async fn wait_for_all<S: AsRef<str>>(
        &self,
        sentinels: &[S],
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        let mut guard = self.inner.lock().await;
        let (rx, seen) = &mut *guard;
        loop {
            let missing: Vec<&str> = sentinels
                .iter()
                .map(AsRef::as_ref)
                .filter(|s| !seen.iter().any(|seen| seen == s))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            match timeout_at(deadline, rx.recv()).await {
                Ok(Some(sentinel)) => seen.push(sentinel),
                Ok(None) => bail!("started channel closed; still missing {missing:?}"),
                Err(_) => bail!("not started within {within:?}: {missing:?} (seen {seen:?})"),
            }
        }
    }

    /// Every sentinel that has entered the tool so far, in order (without
    /// the `finished:` and `cancelled:` reports).
    pub async fn seen(&self) -> Vec<String> {
        let mut guard = self.inner.lock().await;
        let (rx, seen) = &mut *guard;
        while let Ok(sentinel) = rx.try_recv() {
            seen.push(sentinel);
        }
        seen.iter()
            .filter(|event| !event.starts_with("finished:") && !event.starts_with("cancelled:"))
            .cloned()
            .collect()
    }
}

/// A running echo server on `127.0.0.1:<ephemeral>`.
pub struct TestServer {
    /// `http://127.0.0.1:<port>/mcp`
    pub url: String,
    /// Cancelling it stops the server and terminates rmcp's sessions.
    pub shutdown: CancellationToken,
    /// Started signals of the echo tool.
    pub started: Started,
    /// Gates of held calls.
    pub gates: Gates,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Stops the server and waits (bounded) for it to finish.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves the echo server with rmcp's default stateful configuration
/// (`legacy_session_mode: true`, SSE keep-alive 15 s) on loopback, bare when
/// `guard` is `None`, else as the crate documents:
/// `Router::new().nest_service("/mcp", rmcp).layer(guard)`.
pub async fn serve(guard: Option<IdGuardLayer>) -> anyhow::Result<TestServer> {
    let shutdown = CancellationToken::new();
    let (started_tx, started_rx) = mpsc::unbounded_channel();
    let gates = Gates::default();
    let server = EchoServer {
        tool_router: EchoServer::tool_router(),
        started: started_tx,
        gates: gates.clone(),
    };
    let config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_cancellation_token(shutdown.child_token());
    assert!(config.legacy_session_mode, "stateful mode expected");
    let rmcp_service: StreamableHttpService<EchoServer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config);

    let router = axum::Router::new().nest_service("/mcp", rmcp_service);
    let router = match guard {
        Some(layer) => router.layer(layer),
        None => router,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
        }
    });
    Ok(TestServer {
        url: format!("http://{address}/mcp"),
        shutdown,
        started: Started {
            inner: tokio::sync::Mutex::new((started_rx, Vec::new())),
        },
        gates,
        task: Some(task),
    })
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// One POST's exchange as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    /// HTTP status, if response headers arrived.
    pub status: Option<u16>,
    /// `Content-Type` of the response.
    pub content_type: Option<String>,
    /// `Mcp-Session-Id` of the response.
    pub session_id: Option<String>,
    /// The raw body read so far.
    pub body: String,
    /// The JSON text of the first JSON-RPC response (an object with `result`
    /// or `error`) in the body: the SSE event's data, or the JSON body.
    pub response: Option<String>,
    /// The body ended (as opposed to the deadline passing first).
    pub ended: bool,
    /// A transport error, if one ended the exchange.
    pub error: Option<String>,
    /// Time from sending to the end (or to the deadline).
    pub elapsed: Duration,
}

impl Exchange {
    fn is_sse(&self) -> bool {
        self.content_type
            .as_deref()
            .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"))
    }
}

/// Finds the first JSON-RPC response in complete SSE events of `body`.
fn sse_response(body: &str) -> Option<String> {
    let normalized = body.replace("\r\n", "\n").replace('\r', "\n");
    // Only complete events: those followed by a blank line.
    let mut events: Vec<&str> = normalized.split("\n\n").collect();
    events.pop();
    events.into_iter().find_map(|event| {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|data| data.strip_prefix(' ').unwrap_or(data))
            .collect();
        let data = data.join("\n");
        is_response(&data).then_some(data)
    })
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

/// An MCP client in one initialized session.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    session_id: String,
}

impl Client {
    /// Initializes a session: `initialize` without a session header, then
    /// `notifications/initialized` with the session id the server assigned.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .context("building the HTTP client")?;
        let initialize = serde_json::json!({
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "mcp-id-guard-tests", "version": "0" }
            }
        });
        let exchange = post(&http, url, None, initialize.to_string(), OK_TIMEOUT, false).await;
        let (Some(200), Some(session_id), Some(_)) =
            (exchange.status, &exchange.session_id, &exchange.response)
        else {
            bail!("initialize failed: {exchange:?}");
        };
        let session_id = session_id.clone();
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let exchange = post(
            &http,
            url,
            Some(&session_id),
            initialized.to_owned(),
            OK_TIMEOUT,
            false,
        )
        .await;
        if exchange.status != Some(202) {
            bail!("notifications/initialized failed: {exchange:?}");
        }
        Ok(Self {
            http,
            url: url.to_owned(),
            session_id,
        })
    }

    /// The session id the server assigned.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// POSTs a raw JSON body in this session.
    pub async fn post(&self, body: String, within: Duration) -> Exchange {
        post(
            &self.http,
            &self.url,
            Some(&self.session_id),
            body,
            within,
            false,
        )
        .await
    }

    /// Calls `echo` with the raw JSON id `id_json` (sent exactly as written)
    /// and classifies what came back within `within`.
    pub async fn call_echo(&self, id_json: &str, call: &EchoCall, within: Duration) -> CallReport {
        let body = call.request_body(id_json);
        let exchange = self.post(body, within).await;
        CallReport::classify(id_json, &call.sentinel, exchange)
    }

    /// Starts an `echo` call and reads its SSE stream only up to the first
    /// event that carries an `id:` (rmcp's priming event), then drops the
    /// connection, as a client whose connection broke would. Returns that
    /// event id, from which the stream can be resumed with [`resume`](Self::resume).
    pub async fn start_echo_then_drop(
        &self,
        id_json: &str,
        call: &EchoCall,
        within: Duration,
    ) -> anyhow::Result<String> {
        let request = self
            .http
            .post(&self.url)
            .header("accept", ACCEPT)
            .header("content-type", "application/json")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .header("mcp-session-id", &self.session_id)
            .body(call.request_body(id_json));
        let exchange = exchange(request, within, ReadUntil::FirstEventId).await;
        first_event_id(&exchange.body)
            .with_context(|| format!("no SSE event with an id: {exchange:?}"))
    }

    /// Resumes a stream with `GET` and `Last-Event-ID` and waits for the
    /// response headers: once they are in, rmcp has attached the stream, so
    /// events sent from then on arrive on it. Read it with
    /// [`Opened::read_response`]; `within` bounds the whole exchange.
    pub async fn resume(&self, last_event_id: &str, within: Duration) -> Opened {
        let request = self
            .http
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .header("mcp-session-id", &self.session_id)
            .header("last-event-id", last_event_id);
        open(request, within).await
    }

    /// Like [`call_echo`](Self::call_echo), but returns as soon as the
    /// response event has arrived, without waiting for the stream to end (as
    /// a client that closes the stream on its response does).
    pub async fn call_echo_eager(
        &self,
        id_json: &str,
        call: &EchoCall,
        within: Duration,
    ) -> CallReport {
        let body = call.request_body(id_json);
        let exchange = post(
            &self.http,
            &self.url,
            Some(&self.session_id),
            body,
            within,
            true,
        )
        .await;
        CallReport::classify(id_json, &call.sentinel, exchange)
    }
}

/// POSTs `body` with the headers MCP requires and reads the response until it
/// ends or `within` passes (a wall-clock deadline over the whole exchange:
/// SSE keep-alives would defeat any read timeout).
async fn post(
    http: &reqwest::Client,
    url: &str,
    session_id: Option<&str>,
    body: String,
    within: Duration,
    stop_at_response: bool,
) -> Exchange {
    let mut request = http
        .post(url)
        .header("accept", ACCEPT)
        .header("content-type", "application/json")
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .body(body);
    if let Some(session_id) = session_id {
        request = request.header("mcp-session-id", session_id);
    }
    let stop = if stop_at_response {
        ReadUntil::Response
    } else {
        ReadUntil::End
    };
    exchange(request, within, stop).await
}

/// When to stop reading a response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadUntil {
    /// At its end (or the deadline).
    End,
    /// As soon as a JSON-RPC response has arrived.
    Response,
    /// As soon as a complete SSE event with an `id:` line has arrived.
    FirstEventId,
}

/// The `id:` of the first complete SSE event in `body`.
fn first_event_id(body: &str) -> Option<String> {
    let normalized = body.replace("\r\n", "\n").replace('\r', "\n");
    let mut events: Vec<&str> = normalized.split("\n\n").collect();
    events.pop();
    events.into_iter().find_map(|event| {
        event
            .lines()
            .find_map(|line| line.strip_prefix("id:"))
            .map(|id| id.trim_start().to_owned())
    })
}

/// Sends `request` and reads the response as `stop` says, within a
/// wall-clock deadline over the whole exchange.
async fn exchange(request: reqwest::RequestBuilder, within: Duration, stop: ReadUntil) -> Exchange {
    open(request, within).await.read(stop).await
}

/// Sends `request` and waits (within `within`) for the response headers.
async fn open(request: reqwest::RequestBuilder, within: Duration) -> Opened {
    let begun = Instant::now();
    let deadline = tokio::time::Instant::now() + within;
    let mut exchange = Exchange::default();
    let response = match timeout_at(deadline, request.send()).await {
        Ok(Ok(response)) => Some(response),
        Ok(Err(error)) => {
            exchange.error = Some(error.to_string());
            None
        }
        Err(_) => None,
    };
    if let Some(response) = &response {
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
    }
    Opened {
        response,
        exchange,
        begun,
        deadline,
    }
}

/// A response whose headers have arrived (or a failed request), with the
/// deadline of its exchange.
pub struct Opened {
    response: Option<reqwest::Response>,
    exchange: Exchange,
    begun: Instant,
    deadline: tokio::time::Instant,
}

impl Opened {
    /// The HTTP status, if the headers arrived.
    pub fn status(&self) -> Option<u16> {
        self.exchange.status
    }

    /// Reads the body until a JSON-RPC response has arrived, the body ends,
    /// or the deadline passes.
    pub async fn read_response(self) -> Exchange {
        self.read(ReadUntil::Response).await
    }

    async fn read(self, stop: ReadUntil) -> Exchange {
        let Self {
            response,
            mut exchange,
            begun,
            deadline,
        } = self;
        let Some(mut response) = response else {
            exchange.elapsed = begun.elapsed();
            return exchange;
        };
        let mut bytes = Vec::new();
        loop {
            match timeout_at(deadline, response.chunk()).await {
                Ok(Ok(Some(chunk))) => {
                    bytes.extend_from_slice(&chunk);
                    exchange.body = String::from_utf8_lossy(&bytes).into_owned();
                    if exchange.response.is_none() && exchange.is_sse() {
                        exchange.response = sse_response(&exchange.body);
                        if stop == ReadUntil::Response && exchange.response.is_some() {
                            break;
                        }
                    }
                    if stop == ReadUntil::FirstEventId && first_event_id(&exchange.body).is_some() {
                        break;
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
}

/// One `echo` call to make.
#[derive(Debug, Clone)]
pub struct EchoCall {
    /// Unique per server; the result must be `ECHO:<sentinel>`.
    pub sentinel: String,
    /// Work time in the tool.
    pub delay_ms: u64,
    /// Wait for [`Gates::release`] before working.
    pub hold: bool,
}

impl EchoCall {
    /// The `tools/call` body, with `id_json` written exactly as given.
    pub fn request_body(&self, id_json: &str) -> String {
        let arguments = serde_json::json!({
            "sentinel": self.sentinel,
            "delay_ms": self.delay_ms,
            "hold": self.hold,
        });
        format!(
            r#"{{"jsonrpc":"2.0","id":{id_json},"method":"tools/call","params":{{"name":"echo","arguments":{arguments}}}}}"#
        )
    }

    /// A call that works `delay_ms` and answers.
    pub fn new(sentinel: impl Into<String>, delay_ms: u64) -> Self {
        Self {
            sentinel: sentinel.into(),
            delay_ms,
            hold: false,
        }
    }

    /// A call that waits for its gate.
    pub fn held(sentinel: impl Into<String>) -> Self {
        Self {
            sentinel: sentinel.into(),
            delay_ms: 0,
            hold: true,
        }
    }
}

/// What a call got back.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its own result (`ECHO:<own sentinel>`), with exactly the id text sent.
    Own,
    /// Another call's result.
    Wrong {
        /// The sentinel of the result received.
        got: String,
    },
    /// No JSON-RPC response within the deadline.
    Hung,
    /// A non-2xx answer.
    Rejected {
        /// HTTP status.
        status: u16,
        /// `Content-Type` of the answer.
        content_type: Option<String>,
        /// The body, parsed as JSON (`Null` if it is not JSON).
        body: Value,
    },
    /// Anything else (a JSON-RPC error, the own result under another id, a
    /// transport error, a 2xx without a response).
    Other(String),
}

/// One call's outcome with the evidence.
#[derive(Debug, Clone)]
pub struct CallReport {
    /// The call's sentinel.
    pub sentinel: String,
    /// The id JSON text sent.
    pub sent_id: String,
    /// The classification.
    pub outcome: Outcome,
    /// The exact JSON text of the response's `id`, if a response came.
    pub answered_id: Option<String>,
    /// The raw exchange.
    pub exchange: Exchange,
}

impl CallReport {
    /// Classifies what `exchange` brought back for a call with `sentinel` and
    /// `sent_id`.
    pub fn classify(sent_id: &str, sentinel: &str, exchange: Exchange) -> Self {
        let answered_id = exchange.response.as_deref().and_then(raw_id);
        let outcome = match (exchange.status, &exchange.response) {
            (Some(status), _) if !(200..300).contains(&status) => Outcome::Rejected {
                status,
                content_type: exchange.content_type.clone(),
                body: serde_json::from_str(&exchange.body).unwrap_or(Value::Null),
            },
            (_, Some(response)) => classify_response(sent_id, sentinel, response),
            (_, None) if exchange.error.is_some() => {
                Outcome::Other(format!("transport error: {:?}", exchange.error))
            }
            (_, None) if exchange.ended => Outcome::Other(format!(
                "ended without a response: status {:?}, body {:?}",
                exchange.status, exchange.body
            )),
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

    /// Own result, exact id, and the response stream ended.
    pub fn is_clean_own(&self) -> bool {
        self.outcome == Outcome::Own && self.exchange.ended
    }
}

fn classify_response(sent_id: &str, sentinel: &str, response: &str) -> Outcome {
    let Ok(value) = serde_json::from_str::<Value>(response) else {
        return Outcome::Other(format!("unparsable response {response}"));
    };
    let text = value
        .pointer("/result/content/0/text")
        .and_then(Value::as_str);
    let Some(text) = text else {
        return Outcome::Other(format!("response without echo text: {response}"));
    };
    let Some(got) = text.strip_prefix("ECHO:") else {
        return Outcome::Other(format!("unexpected echo text: {response}"));
    };
    if got != sentinel {
        return Outcome::Wrong {
            got: got.to_owned(),
        };
    }
    match raw_id(response) {
        Some(id) if id == sent_id => Outcome::Own,
        id => Outcome::Other(format!(
            "own result but id {id:?} instead of {sent_id}: {response}"
        )),
    }
}

/// Counts of outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Own result with the id sent.
    pub own: usize,
    /// Another call's result.
    pub wrong: usize,
    /// No answer in time.
    pub hung: usize,
    /// Non-2xx answer.
    pub rejected: usize,
    /// Anything else.
    pub other: usize,
}

impl Tally {
    /// Counts `reports`.
    pub fn of(reports: &[CallReport]) -> Self {
        let mut tally = Self::default();
        for report in reports {
            match report.outcome {
                Outcome::Own => tally.own += 1,
                Outcome::Wrong { .. } => tally.wrong += 1,
                Outcome::Hung => tally.hung += 1,
                Outcome::Rejected { .. } => tally.rejected += 1,
                Outcome::Other(_) => tally.other += 1,
            }
        }
        tally
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "own {}, wrong {}, hung {}, rejected {}, other {}",
            self.own, self.wrong, self.hung, self.rejected, self.other
        )
    }
}

// ---------------------------------------------------------------------------
// Scenarios shared by the tests and the demo
// ---------------------------------------------------------------------------

/// The `i`-th of `n` distinct delays in `0..300` ms, in shuffled order, so the
/// calls of a burst finish in an order unrelated to the order they were sent.
pub fn burst_delay(i: usize, n: usize) -> u64 {
    // 7 is coprime with the burst sizes used (12), so this is a permutation.
    let step = 300 / n as u64;
    ((i * 7) % n) as u64 * step
}

/// Sends `n` concurrent `echo` calls, all with the id `id_json`, in one
/// session, each bounded by `within`. Sentinels are `<tag>-<i>`.
pub async fn burst(
    client: &Client,
    tag: &str,
    id_json: &str,
    n: usize,
    within: Duration,
) -> Vec<CallReport> {
    let calls: Vec<EchoCall> = (0..n)
        .map(|i| EchoCall::new(format!("{tag}-{i:02}"), burst_delay(i, n)))
        .collect();
    futures::future::join_all(
        calls
            .iter()
            .map(|call| client.call_echo(id_json, call, within)),
    )
    .await
}

/// The pair case: A (held) is sent with `id_a`; once it has started, B (held)
/// is sent with `id_b`. If `b_reaches_server`, once B has started too, A is
/// released and, after A's answer (or hang), B. Otherwise B is expected to be
/// answered by the guard while A is still held, and A is released after B's
/// answer. Returns `(A, B)`.
pub async fn pair(
    server: &TestServer,
    client: &Client,
    tag: &str,
    (id_a, id_b): (&str, &str),
    b_reaches_server: bool,
    within: Duration,
) -> anyhow::Result<(CallReport, CallReport)> {
    let a = EchoCall::held(format!("{tag}-A"));
    let b = EchoCall::held(format!("{tag}-B"));
    let task_a = tokio::spawn({
        let (client, a, id_a) = (client.clone(), a.clone(), id_a.to_owned());
        async move { client.call_echo(&id_a, &a, within).await }
    });
    server.started.wait_for(&a.sentinel, WAIT_TIMEOUT).await?;
    let task_b = tokio::spawn({
        let (client, b, id_b) = (client.clone(), b.clone(), id_b.to_owned());
        async move { client.call_echo(&id_b, &b, within).await }
    });
    if b_reaches_server {
        server.started.wait_for(&b.sentinel, WAIT_TIMEOUT).await?;
        server.gates.release(&a.sentinel);
        let report_a = task_a.await?;
        server.gates.release(&b.sentinel);
        let report_b = task_b.await?;
        Ok((report_a, report_b))
    } else {
        // B must be answered while A is still held (if it wrongly reaches the
        // server it parks on its gate and ends up hung).
        let report_b = task_b.await?;
        server.gates.release(&a.sentinel);
        let report_a = task_a.await?;
        server.gates.release(&b.sentinel);
        Ok((report_a, report_b))
    }
}

/// Polls `layer.stats()` until nothing is in flight and no session is tracked,
/// or `within` passes; returns the last snapshot. Release happens when the
/// response body ends on the server side, which may trail the client's view.
pub async fn drained_stats(layer: &IdGuardLayer, within: Duration) -> Stats {
    let deadline = Instant::now() + within;
    loop {
        let stats = layer.stats();
        if (stats.in_flight_requests == 0 && stats.tracked_sessions == 0)
            || Instant::now() >= deadline
        {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
