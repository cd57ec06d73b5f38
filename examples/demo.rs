//! Shows the cross-wiring bug on a real rmcp 3.11 server and the guard fixing
//! it, all in-process over loopback:
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! Runs two scenarios against a bare server and the guard with `Remap`,
//! `Reject` and `Queue`, and prints what every call got back. Logs are off
//! unless `RUST_LOG` is set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use mcp_id_guard::{IdGuardLayer, OnDuplicate, Stats};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A legacy-session protocol revision: the guard tracks its sessions.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// How long a call may go without its answer before it counts as hung (rmcp's
/// SSE keep-alives would defeat a read timeout, so this is a deadline).
const HANG_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound for calls expected to be answered.
const OK_TIMEOUT: Duration = Duration::from_secs(10);
const BURST: usize = 12;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Policy {
    Bare,
    Remap,
    Reject,
    Queue,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Bare => "bare rmcp",
            Policy::Remap => "guard: Remap",
            Policy::Reject => "guard: Reject",
            Policy::Queue => "guard: Queue",
        }
    }

    fn layer(self) -> Option<IdGuardLayer> {
        match self {
            Policy::Bare => None,
            Policy::Remap => Some(IdGuardLayer::new()),
            Policy::Reject => Some(IdGuardLayer::new().on_duplicate(OnDuplicate::Reject)),
            Policy::Queue => Some(IdGuardLayer::new().on_duplicate(OnDuplicate::Queue)),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Burst,
    Pair,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Burst => "12 concurrent calls, all id 1",
            Scenario::Pair => "pair: B (id 1) while A (id 1) runs",
        }
    }
}

struct Row {
    scenario: Scenario,
    policy: Policy,
    tally: Tally,
    counters: String,
    reports: Vec<Report>,
}

/// Runs one scenario on a fresh server in its own session.
async fn run(scenario: Scenario, policy: Policy) -> anyhow::Result<Row> {
    let layer = policy.layer();
    let server = serve(layer.clone()).await?;
    let client = Client::connect(&server.url).await?;
    // The bare server is expected to hang calls: give up on them after
    // HANG_TIMEOUT. Guarded calls get the generous bound (they finish in
    // milliseconds).
    let within = if policy == Policy::Bare {
        HANG_TIMEOUT
    } else {
        OK_TIMEOUT
    };
    let tag = match (scenario, policy) {
        (Scenario::Burst, Policy::Bare) => "burst-bare",
        (Scenario::Burst, Policy::Remap) => "burst-remap",
        (Scenario::Burst, Policy::Reject) => "burst-reject",
        (Scenario::Pair, Policy::Bare) => "pair-bare",
        (Scenario::Pair, Policy::Remap) => "pair-remap",
        (Scenario::Pair, Policy::Reject) => "pair-reject",
        (Scenario::Burst, Policy::Queue) => "burst-queue",
        (Scenario::Pair, Policy::Queue) => "pair-queue",
    };
    let reports = match scenario {
        Scenario::Burst => burst(&client, tag, "1", BURST, within).await,
        Scenario::Pair if policy == Policy::Queue => queued_pair(&server, &client, tag).await?,
        Scenario::Pair => {
            let b_reaches_server = policy != Policy::Reject;
            let (a, b) = pair(&server, &client, tag, ("1", "1"), b_reaches_server, within).await?;
            vec![a, b]
        }
    };
    let counters = match &layer {
        Some(layer) => {
            let stats = drained_stats(layer).await;
            format!(
                "passed {}, remapped {}, rejected {}, queued {}; {} left in flight",
                stats.passed_total,
                stats.remapped_total,
                stats.rejected_total,
                stats.queued_total,
                stats.in_flight_requests
            )
        }
        None => "-".to_owned(),
    };
    server.stop();
    Ok(Row {
        scenario,
        policy,
        tally: Tally::of(&reports),
        counters,
        reports,
    })
}

/// The pair case under Queue: B waits in the guard until A's exchange ends,
/// so B's gate is opened before B can reach the server (gates stay open).
async fn queued_pair(server: &Server, client: &Client, tag: &str) -> anyhow::Result<Vec<Report>> {
    let (a, b) = (format!("{tag}-A"), format!("{tag}-B"));
    let task_a = client.spawn_call("1", &a, Work::Held, OK_TIMEOUT);
    server.wait_started(&a).await?;
    let task_b = client.spawn_call("1", &b, Work::Held, OK_TIMEOUT);
    server.release(&b);
    server.release(&a);
    Ok(vec![task_a.await?, task_b.await?])
}

/// Breaks `text` into lines of at most `width` columns at spaces.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line_len = 0;
    for word in text.split_whitespace() {
        if line_len > 0 && line_len + 1 + word.len() > width {
            out.push('\n');
            line_len = 0;
        } else if line_len > 0 {
            out.push(' ');
            line_len += 1;
        }
        out.push_str(word);
        line_len += word.len();
    }
    out
}

fn print_table(rows: &[Row]) {
    let header = format!(
        "{:<36} {:<14} {:>4} {:>13} {:>5} {:>9}   guard counters",
        "scenario", "server", "OK", "wrong result", "hung", "rejected"
    );
    let lines: Vec<String> = rows
        .iter()
        .map(|row| {
            format!(
                "{:<36} {:<14} {:>4} {:>13} {:>5} {:>9}   {}",
                row.scenario.name(),
                row.policy.name(),
                row.tally.own,
                row.tally.wrong,
                row.tally.hung,
                row.tally.rejected,
                row.counters
            )
        })
        .collect();
    let width = lines
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max(header.len());
    println!("{header}");
    println!("{}", "-".repeat(width));
    for line in lines {
        println!("{line}");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let begun = Instant::now();

    let explanation = format!(
        "MCP's stateful streamable-HTTP transport routes each response back to the POST that \
         asked for it by JSON-RPC id alone. Clients such as claude.ai's connectors send every \
         tools/call with id 1 in one shared Mcp-Session-Id, so concurrent calls collide: on a \
         bare rmcp 3.11 server a later call receives an earlier call's result and the other \
         calls never get an answer (their SSE streams stay open; {}s here counts as hung). \
         The mcp-id-guard layer in front of the same server either remaps duplicate ids to \
         unique server-side ids and restores the client's id in the response (Remap, the \
         default), answers duplicates at once with HTTP 400 and JSON-RPC -32600 (Reject), \
         or holds each duplicate until the earlier call with its id has ended (Queue). \
         Each row is a fresh in-process server on 127.0.0.1 with one session; OK means the \
         call got its own echo back with exactly the id it sent.",
        HANG_TIMEOUT.as_secs()
    );
    println!("{}\n", wrap(&explanation, 96));

    // The bare scenarios wait out their hung calls; run them side by side so
    // that costs one hang timeout, not two.
    let (bare_burst, bare_pair) = tokio::join!(
        run(Scenario::Burst, Policy::Bare),
        run(Scenario::Pair, Policy::Bare)
    );
    let mut rows = vec![bare_burst?];
    for policy in [Policy::Remap, Policy::Reject, Policy::Queue] {
        rows.push(run(Scenario::Burst, policy).await?);
    }
    rows.push(bare_pair?);
    for policy in [Policy::Remap, Policy::Reject, Policy::Queue] {
        rows.push(run(Scenario::Pair, policy).await?);
    }

    print_table(&rows);
    println!("\nfinished in {:.1}s", begun.elapsed().as_secs_f64());

    let mut unexpected = 0;
    for row in &rows {
        for report in &row.reports {
            if let Outcome::Other(detail) = &report.outcome {
                println!("note: {}: {detail}", report.sentinel);
            }
        }
        let guarded = row.policy != Policy::Bare;
        if guarded && (row.tally.wrong + row.tally.hung + row.tally.other) > 0 {
            unexpected += 1;
        }
    }
    anyhow::ensure!(
        unexpected == 0,
        "{unexpected} guarded scenario(s) had a wrong, hung or unexpected answer"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The echo server: rmcp 3.11 with one tool, served on loopback
// ---------------------------------------------------------------------------

/// Arguments of the `echo` tool.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// Answered as `ECHO:<sentinel>`.
    sentinel: String,
    /// Simulated work, in milliseconds.
    #[serde(default)]
    delay_ms: u64,
    /// Wait until the demo opens this call's gate.
    #[serde(default)]
    hold: bool,
}

/// What the demo and the tool share: which calls have started, and the gates
/// held calls wait on (a gate opened before its call arrives stays open).
#[derive(Clone, Default)]
struct Shared {
    started: Arc<Mutex<Vec<String>>>,
    started_changed: Arc<watch::Sender<()>>,
    gates: Arc<Mutex<HashMap<String, watch::Sender<bool>>>>,
}

impl Shared {
    fn gate(&self, sentinel: &str) -> watch::Sender<bool> {
        let mut gates = self
            .gates
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        gates
            .entry(sentinel.to_owned())
            .or_insert_with(|| watch::channel(false).0)
            .clone()
    }
}

#[derive(Clone)]
struct EchoServer {
    tool_router: ToolRouter<Self>,
    shared: Shared,
}

#[tool_router]
impl EchoServer {
    #[tool(description = "Echo a sentinel back as ECHO:<sentinel>")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        self.shared
            .started
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(args.sentinel.clone());
        self.shared.started_changed.send_replace(());
        if args.hold {
            let mut open = self.shared.gate(&args.sentinel).subscribe();
            let _ = open.wait_for(|open| *open).await;
        }
        if args.delay_ms > 0 {
            // Simulated work, not synchronisation.
            tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
        }
        format!("ECHO:{}", args.sentinel)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mcp-id-guard-demo", "0.0.0"))
    }
}

/// A running echo server on `127.0.0.1:<ephemeral>`.
struct Server {
    url: String,
    shared: Shared,
    shutdown: CancellationToken,
}

impl Server {
    /// Waits (bounded) until the call with `sentinel` has entered the tool.
    async fn wait_started(&self, sentinel: &str) -> anyhow::Result<()> {
        let mut changed = self.shared.started_changed.subscribe();
        let started = || {
            self.shared
                .started
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .iter()
                .any(|seen| seen == sentinel)
        };
        tokio::time::timeout(OK_TIMEOUT, changed.wait_for(|()| started()))
            .await
            .with_context(|| format!("{sentinel} did not start"))??;
        Ok(())
    }

    /// Lets the held call with `sentinel` go on (now or when it arrives).
    fn release(&self, sentinel: &str) {
        self.shared.gate(sentinel).send_replace(true);
    }

    fn stop(self) {
        self.shutdown.cancel();
    }
}

/// Serves the echo server with rmcp's default stateful configuration, bare or
/// as the crate documents: `Router::new().nest_service("/mcp", rmcp).layer(guard)`.
async fn serve(guard: Option<IdGuardLayer>) -> anyhow::Result<Server> {
    let shutdown = CancellationToken::new();
    let shared = Shared::default();
    let handler = EchoServer {
        tool_router: EchoServer::tool_router(),
        shared: shared.clone(),
    };
    let config =
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
    let rmcp: StreamableHttpService<EchoServer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(handler.clone()), Default::default(), config);
    let router = axum::Router::new().nest_service("/mcp", rmcp);
    let router = match guard {
        Some(layer) => router.layer(layer),
        None => router,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
        }
    });
    Ok(Server {
        url,
        shared,
        shutdown,
    })
}

/// Polls the guard's counters until nothing is in flight (or the bound
/// passes): the guard lets go of a call when the server side of its stream
/// ends, which may trail what the client saw.
async fn drained_stats(layer: &IdGuardLayer) -> Stats {
    let deadline = Instant::now() + OK_TIMEOUT;
    loop {
        let stats = layer.stats();
        if stats.in_flight_requests == 0 || Instant::now() >= deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------
// The client: MCP streamable HTTP over reqwest
// ---------------------------------------------------------------------------

/// What a call got back.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// Its own result with exactly the id it sent.
    Own,
    /// Another call's result.
    Wrong,
    /// No answer before the deadline.
    Hung,
    /// A non-2xx answer.
    Rejected,
    /// Anything else.
    Other(String),
}

struct Report {
    sentinel: String,
    outcome: Outcome,
}

/// Counts of outcomes.
#[derive(Default)]
struct Tally {
    own: usize,
    wrong: usize,
    hung: usize,
    rejected: usize,
    other: usize,
}

impl Tally {
    fn of(reports: &[Report]) -> Self {
        let mut tally = Self::default();
        for report in reports {
            match report.outcome {
                Outcome::Own => tally.own += 1,
                Outcome::Wrong => tally.wrong += 1,
                Outcome::Hung => tally.hung += 1,
                Outcome::Rejected => tally.rejected += 1,
                Outcome::Other(_) => tally.other += 1,
            }
        }
        tally
    }
}

/// How the tool treats a call.
#[derive(Clone, Copy)]
enum Work {
    /// Simulated work of this many milliseconds.
    Millis(u64),
    /// Wait for the gate.
    Held,
}

/// One initialized MCP session.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    url: String,
    session: Option<String>,
}

impl Client {
    /// `initialize`, then `notifications/initialized` in the new session.
    async fn connect(url: &str) -> anyhow::Result<Self> {
        let mut client = Self {
            http: reqwest::Client::builder().no_proxy().build()?,
            url: url.to_owned(),
            session: None,
        };
        let initialize = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "mcp-id-guard-demo", "version": "0" }
            }
        });
        let response = client.post(initialize.to_string()).send().await?;
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let Some(session) = session else {
            bail!("initialize: {} without a session id", response.status());
        };
        client.session = Some(session);
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let status = client.post(initialized.to_owned()).send().await?.status();
        anyhow::ensure!(status == 202, "notifications/initialized: {status}");
        Ok(client)
    }

    fn post(&self, body: String) -> reqwest::RequestBuilder {
        let request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .body(body);
        match &self.session {
            Some(session) => request.header("mcp-session-id", session),
            None => request,
        }
    }

    /// Calls `echo` with the id `id_json` (written exactly as given) and
    /// reads the answer until its first JSON-RPC response or `within`.
    async fn call(&self, id_json: &str, sentinel: &str, work: Work, within: Duration) -> Report {
        let (delay_ms, hold) = match work {
            Work::Millis(delay_ms) => (delay_ms, false),
            Work::Held => (0, true),
        };
        let arguments =
            serde_json::json!({ "sentinel": sentinel, "delay_ms": delay_ms, "hold": hold });
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id_json},"method":"tools/call","params":{{"name":"echo","arguments":{arguments}}}}}"#
        );
        let outcome = match tokio::time::timeout(within, self.answer(body)).await {
            Err(_) => Outcome::Hung,
            Ok(Err(error)) => Outcome::Other(format!("{error:#}")),
            Ok(Ok((status, _))) if !(200..300).contains(&status) => Outcome::Rejected,
            Ok(Ok((_, response))) => classify(id_json, sentinel, &response),
        };
        Report {
            sentinel: sentinel.to_owned(),
            outcome,
        }
    }

    fn spawn_call(
        &self,
        id_json: &str,
        sentinel: &str,
        work: Work,
        within: Duration,
    ) -> tokio::task::JoinHandle<Report> {
        let (client, id_json, sentinel) = (self.clone(), id_json.to_owned(), sentinel.to_owned());
        tokio::spawn(async move { client.call(&id_json, &sentinel, work, within).await })
    }

    /// The status and the first JSON-RPC response of a POST (an SSE event's
    /// data, or the JSON body). The stream may stay open after the response,
    /// so reading stops there.
    async fn answer(&self, body: String) -> anyhow::Result<(u16, Value)> {
        let mut response = self.post(body).send().await?;
        let status = response.status().as_u16();
        let mut text = String::new();
        while let Some(chunk) = response.chunk().await? {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if let Some(found) = first_response(&text) {
                return Ok((status, found));
            }
        }
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok((status, value))
    }
}

/// The first JSON-RPC response among the complete SSE events of `text`.
fn first_response(text: &str) -> Option<Value> {
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let complete = &text[..text.rfind("\n\n")?];
    complete.split("\n\n").find_map(|event| {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|data| data.strip_prefix(' ').unwrap_or(data))
            .collect();
        let value: Value = serde_json::from_str(&data.join("\n")).ok()?;
        (value.get("result").is_some() || value.get("error").is_some()).then_some(value)
    })
}

fn classify(id_json: &str, sentinel: &str, response: &Value) -> Outcome {
    let text = response
        .pointer("/result/content/0/text")
        .and_then(Value::as_str);
    let Some(got) = text.and_then(|text| text.strip_prefix("ECHO:")) else {
        return Outcome::Other(format!("unexpected answer {response}"));
    };
    let sent: Value = serde_json::from_str(id_json).unwrap_or(Value::Null);
    match (got == sentinel, response["id"] == sent) {
        (true, true) => Outcome::Own,
        (true, false) => Outcome::Other(format!("own result under id {}", response["id"])),
        (false, _) => Outcome::Wrong,
    }
}

/// `n` concurrent calls, all with the id `id_json`, with distinct delays in
/// shuffled order, so they finish in an order unrelated to the sending order.
async fn burst(
    client: &Client,
    tag: &str,
    id_json: &str,
    n: usize,
    within: Duration,
) -> Vec<Report> {
    let step = 300 / n as u64;
    let calls = (0..n).map(|i| {
        // 7 is coprime with the burst size, so the delays are a permutation.
        let delay_ms = ((i * 7) % n) as u64 * step;
        let sentinel = format!("{tag}-{i:02}");
        async move {
            client
                .call(id_json, &sentinel, Work::Millis(delay_ms), within)
                .await
        }
    });
    futures::future::join_all(calls).await
}

/// A (held) with `id_a`; once it has started, B (held) with `id_b`. If B
/// reaches the server, A is released first, then B; otherwise B is answered
/// by the guard while A is still held.
async fn pair(
    server: &Server,
    client: &Client,
    tag: &str,
    (id_a, id_b): (&str, &str),
    b_reaches_server: bool,
    within: Duration,
) -> anyhow::Result<(Report, Report)> {
    let (a, b) = (format!("{tag}-A"), format!("{tag}-B"));
    let task_a = client.spawn_call(id_a, &a, Work::Held, within);
    server.wait_started(&a).await?;
    let task_b = client.spawn_call(id_b, &b, Work::Held, within);
    if b_reaches_server {
        server.wait_started(&b).await?;
        server.release(&a);
        let report_a = task_a.await?;
        server.release(&b);
        Ok((report_a, task_b.await?))
    } else {
        let report_b = task_b.await?;
        server.release(&a);
        let report_a = task_a.await?;
        server.release(&b);
        Ok((report_a, report_b))
    }
}
