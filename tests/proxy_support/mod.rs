//! Harness of the proxy tests (`tests/proxy_*.rs`): the guarded proxy served on
//! loopback, a real rmcp 3.11 echo server as its upstream, small hand-made
//! upstreams (header echo, slow SSE), and an HTTP client that speaks MCP
//! streamable HTTP with legacy sessions.
//!
//! Ordering between a test and the rmcp server uses channels: the echo tool
//! reports `started` before anything else, and a call the test holds parks on
//! a per-sentinel [`Notify`] until released. Every wait is bounded.

// Each test target uses a different subset.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use mcp_id_guard::proxy::{BoxError, ClientAddr, Proxy};
use mcp_id_guard::{IdGuardLayer, Stats};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower_layer::Layer;
use tower_service::Service;

/// A legacy-session revision: the guard tracks its sessions.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// What every MCP POST accepts (rmcp answers 406 otherwise).
pub const ACCEPT: &str = "application/json, text/event-stream";
/// How long a call may go without its answer before it counts as hung.
pub const HANG_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound for things expected to succeed (generous for a loaded machine).
pub const OK_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Serving a tower service on loopback, as the binary does
// ---------------------------------------------------------------------------

/// A server on `127.0.0.1:<ephemeral>`; stops accepting when dropped.
pub struct Served {
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Serves `service` with hyper-util's auto (HTTP/1.1 + h2c) server, putting
/// the peer address into every request as [`ClientAddr`].
pub async fn serve<S, B>(service: S) -> anyhow::Result<Served>
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
            let per_request = hyper::service::service_fn(move |mut request: Request<Incoming>| {
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
    serve(guard.layer(proxy)).await
}

/// A loopback port nothing listens on (bound, then released).
pub fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// Waits (bounded) until nothing is in flight, then returns the counters.
pub async fn drained(guard: &IdGuardLayer) -> anyhow::Result<Stats> {
    let deadline = Instant::now() + OK_TIMEOUT;
    loop {
        let stats = guard.stats();
        if stats.in_flight_requests == 0 && stats.tracked_sessions == 0 {
            return Ok(stats);
        }
        if Instant::now() > deadline {
            bail!("stats did not drain: {stats:?}");
        }
        // Polling a counter that is released by another task.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------
// The rmcp echo server
// ---------------------------------------------------------------------------

/// Arguments of the `echo` tool.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct EchoArgs {
    /// Answered as `ECHO:<sentinel>`; keys the started signal and the hold.
    pub sentinel: String,
    /// Simulated work after the hold, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
}

/// Holds for calls, by sentinel. A release before the call arrives is kept
/// (a stored `Notify` permit).
#[derive(Debug, Clone, Default)]
pub struct Holds(Arc<Mutex<HashMap<String, Arc<Notify>>>>);

impl Holds {
    /// Makes the call with `sentinel` park in the tool until released.
    pub fn hold(&self, sentinel: &str) {
        self.0
            .lock()
            .unwrap()
            .insert(sentinel.to_owned(), Arc::new(Notify::new()));
    }

    /// Lets a held call go on.
    pub fn release(&self, sentinel: &str) {
        if let Some(notify) = self.0.lock().unwrap().get(sentinel) {
            notify.notify_one();
        }
    }

    fn get(&self, sentinel: &str) -> Option<Arc<Notify>> {
        self.0.lock().unwrap().get(sentinel).cloned()
    }
}

/// rmcp's per-session handler: one tool, `echo`.
#[derive(Clone)]
pub struct EchoServer {
    tool_router: ToolRouter<Self>,
    started: mpsc::UnboundedSender<String>,
    holds: Holds,
}

#[tool_router]
impl EchoServer {
    #[tool(description = "Answers ECHO:<sentinel>")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        let _ = self.started.send(args.sentinel.clone());
        if let Some(hold) = self.holds.get(&args.sentinel) {
            hold.notified().await;
        }
        if args.delay_ms > 0 {
            // Simulated work (the scenario), not synchronisation.
            tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
        }
        let _ = self.started.send(format!("{}:done", args.sentinel));
        format!("ECHO:{}", args.sentinel)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("proxy-test-echo", "0.0.0"))
    }
}

/// A running, unguarded rmcp server on loopback, at `/mcp`.
pub struct Rmcp {
    /// `http://127.0.0.1:<port>`: the proxy's upstream base.
    pub base: String,
    /// `http://127.0.0.1:<port>/mcp`: where clients go directly (controls).
    pub url: String,
    pub holds: Holds,
    started: tokio::sync::Mutex<(mpsc::UnboundedReceiver<String>, Vec<String>)>,
    shutdown: CancellationToken,
}

impl Drop for Rmcp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Rmcp {
    pub async fn start() -> anyhow::Result<Self> {
        let (started_tx, started_rx) = mpsc::unbounded_channel();
        let holds = Holds::default();
        let shutdown = CancellationToken::new();
        let handler = EchoServer {
            tool_router: EchoServer::tool_router(),
            started: started_tx,
            holds: holds.clone(),
        };
        let service: StreamableHttpService<EchoServer, LocalSessionManager> =
            StreamableHttpService::new(
                move || Ok(handler.clone()),
                Default::default(),
                StreamableHttpServerConfig::default()
                    .with_sse_keep_alive(None)
                    .with_cancellation_token(shutdown.child_token()),
            );
        let router = axum::Router::new().nest_service("/mcp", service);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move { stop.cancelled_owned().await })
                .await;
        });
        Ok(Self {
            base: format!("http://{addr}"),
            url: format!("http://{addr}/mcp"),
            holds,
            started: tokio::sync::Mutex::new((started_rx, Vec::new())),
            shutdown,
        })
    }

    /// Waits until every call in `sentinels` has entered the tool (or, for
    /// `"<sentinel>:done"`, has returned its result to rmcp).
    pub async fn wait_started<S: AsRef<str>>(&self, sentinels: &[S]) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + OK_TIMEOUT;
        let mut guard = self.started.lock().await;
        let (rx, seen) = &mut *guard;
        loop {
            let missing: Vec<&str> = sentinels
                .iter()
                .map(AsRef::as_ref)
                .filter(|wanted| !seen.iter().any(|seen| seen == wanted))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(sentinel)) => seen.push(sentinel),
                Ok(None) => bail!("started channel closed; missing {missing:?}"),
                Err(_) => bail!("not started in time: {missing:?} (seen {seen:?})"),
            }
        }
    }

    /// The sentinels that have entered the tool so far.
    pub async fn started_so_far(&self) -> Vec<String> {
        let mut guard = self.started.lock().await;
        let (rx, seen) = &mut *guard;
        while let Ok(sentinel) = rx.try_recv() {
            seen.push(sentinel);
        }
        seen.iter()
            .filter(|sentinel| !sentinel.ends_with(":done"))
            .cloned()
            .collect()
    }
}

// ---------------------------------------------------------------------------
// An MCP client over plain HTTP
// ---------------------------------------------------------------------------

/// One MCP session, spoken with reqwest.
#[derive(Clone)]
pub struct Session {
    pub client: reqwest::Client,
    pub url: String,
    pub id: String,
}

impl Session {
    /// `initialize` + `notifications/initialized` against `url`.
    pub async fn open(url: &str) -> anyhow::Result<Self> {
        let client = reqwest::Client::new();
        let response = tokio::time::timeout(
            OK_TIMEOUT,
            client
                .post(url)
                .header("accept", ACCEPT)
                .header("content-type", "application/json")
                .body(
                    serde_json::json!({
                        "jsonrpc": "2.0", "id": 0, "method": "initialize",
                        "params": {
                            "protocolVersion": PROTOCOL_VERSION,
                            "capabilities": {},
                            "clientInfo": { "name": "proxy-test", "version": "0" }
                        }
                    })
                    .to_string(),
                )
                .send(),
        )
        .await
        .context("initialize timed out")??;
        anyhow::ensure!(
            response.status().is_success(),
            "initialize: {}",
            response.status()
        );
        let id = response
            .headers()
            .get("mcp-session-id")
            .context("no Mcp-Session-Id on the initialize response")?
            .to_str()?
            .to_owned();
        let body = tokio::time::timeout(OK_TIMEOUT, response.text()).await??;
        anyhow::ensure!(
            find_response(&body).is_some_and(|reply| reply.get("result").is_some()),
            "initialize answered {body}"
        );
        let session = Self {
            client,
            url: url.to_owned(),
            id,
        };
        let status = session
            .post(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .send()
            .await?
            .status();
        anyhow::ensure!(status == 202, "notifications/initialized: {status}");
        Ok(session)
    }

    /// A POST of `message` in this session, headers set.
    pub fn post(&self, message: Value) -> reqwest::RequestBuilder {
        self.client
            .post(&self.url)
            .header("accept", ACCEPT)
            .header("content-type", "application/json")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .body(message.to_string())
    }

    /// `tools/call echo` with JSON-RPC id `id`; bounded by `within`.
    pub async fn echo(
        &self,
        id: Value,
        sentinel: &str,
        delay_ms: u64,
        within: Duration,
    ) -> Outcome {
        let message = serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": "echo", "arguments": { "sentinel": sentinel, "delay_ms": delay_ms } }
        });
        let exchange = async {
            let response = self.post(message).send().await?;
            let status = response.status().as_u16();
            let text = response.text().await?;
            anyhow::Ok((status, text))
        };
        let (status, text) = match tokio::time::timeout(within, exchange).await {
            Err(_) => return Outcome::Hung,
            Ok(Err(error)) => return Outcome::Other(format!("transport error: {error:#}")),
            Ok(Ok(answer)) => answer,
        };
        let Some(reply) = find_response(&text) else {
            return Outcome::Other(format!("{status}: no JSON-RPC response in {text:?}"));
        };
        if let Some(error) = reply.get("error") {
            return Outcome::Rejected {
                status,
                id: reply["id"].clone(),
                code: error["code"].as_i64().unwrap_or_default(),
            };
        }
        let result = reply["result"].to_string();
        if status == 200 && reply["id"] == id && result.contains(&format!("\"ECHO:{sentinel}\"")) {
            Outcome::Own
        } else {
            Outcome::Wrong(format!("id {} result {result}", reply["id"]))
        }
    }
}

/// What one `tools/call` got back.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its own result with its own id.
    Own,
    /// A result, but not its own (another call's, or its id was wrong).
    Wrong(String),
    /// A JSON-RPC error.
    Rejected { status: u16, id: Value, code: i64 },
    /// No answer within the bound.
    Hung,
    /// Anything else.
    Other(String),
}

/// Counts of outcomes, for the printed summaries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub own: usize,
    pub wrong: usize,
    pub rejected: usize,
    pub hung: usize,
    pub other: usize,
}

impl Tally {
    pub fn of(outcomes: &[Outcome]) -> Self {
        let mut tally = Self::default();
        for outcome in outcomes {
            match outcome {
                Outcome::Own => tally.own += 1,
                Outcome::Wrong(_) => tally.wrong += 1,
                Outcome::Rejected { .. } => tally.rejected += 1,
                Outcome::Hung => tally.hung += 1,
                Outcome::Other(_) => tally.other += 1,
            }
        }
        tally
    }
}

/// The first JSON-RPC response (an object with `result` or `error`) in a
/// body that is JSON or an SSE stream.
pub fn find_response(body: &str) -> Option<Value> {
    let is_response = |value: &Value| value.get("result").is_some() || value.get("error").is_some();
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return is_response(&value).then_some(value);
    }
    sse_data(body)
        .into_iter()
        .filter_map(|data| serde_json::from_str::<Value>(&data).ok())
        .find(is_response)
}

/// The `data` of each event in an SSE text (multi-line data joined by `\n`).
pub fn sse_data(text: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    for line in text.lines() {
        if line.is_empty() {
            if let Some(data) = data.take() {
                events.push(data);
            }
        } else if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => data = Some(value.to_owned()),
            }
        }
    }
    events.extend(data);
    events
}

/// Reads from an SSE response until one whole event (a blank line) has
/// arrived; returns the bytes read so far.
pub async fn first_event(response: &mut reqwest::Response) -> anyhow::Result<String> {
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = response
            .chunk()
            .await?
            .ok_or_else(|| anyhow!("stream ended before a whole event: {text:?}"))?;
        text.push_str(std::str::from_utf8(&chunk)?);
    }
    Ok(text)
}
