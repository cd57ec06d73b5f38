//! End-to-end cost of the guard: the real rmcp 3.11 echo server over loopback,
//! bare and behind [`IdGuardLayer`], driven by the same closed-loop load.
//!
//! ```text
//! cargo run --release -p mcp-id-guard-loadtest
//! cargo run --release -p mcp-id-guard-loadtest -- --duration 3 --rounds 10 --concurrency 64 --sessions 16
//! ```
//!
//! Options (`--help` lists them with their environment variables and
//! defaults): `--duration` seconds per measured run (1.5), `--rounds` (8; each
//! runs every mode once), `--concurrency` requests in flight (64),
//! `--sessions` MCP sessions the load is spread over (16), `--warmup` seconds
//! of unmeasured load per mode first (1), `--nodelay` (1; 0 serves with axum's
//! defaults, Nagle on), `--modes` which runs to make, in order
//! (`bare,guarded,colliding`; one alone is handy under a profiler;
//! `bare-long-ids` adds bare rmcp with unique string ids as long as
//! server-side ids), `--serve ADDR` (serve only the bare echo server on that
//! loopback address until killed, with no load: an upstream for another
//! proxy, as `benches/proxy_vs_nginx.sh` uses it).
//!
//! The server is rmcp 3.11's `StreamableHttpService` in its default stateful
//! mode with one tool, `echo`, nested at `/mcp` in an axum router, the guard
//! layered on the router, as the crate documents, and accepted connections
//! get `TCP_NODELAY`: with Nagle's algorithm on, the
//! last chunk of each SSE response waits for the client's delayed ACK, and
//! every call takes ~40 ms of idle time, which hides any CPU cost
//! (`--nodelay 0` shows it). Both servers run side by side in this process. Each round runs three
//! modes, `bare` (unique ids), `guarded` (unique ids) and `guarded, colliding`
//! (every request has id 1, so concurrent requests of a session collide and
//! all but one are remapped), in alternating order (ABC, CBA, ...) so that
//! drift of a shared machine falls on every mode alike. A bare server cannot
//! take colliding ids (responses cross-wire and calls hang), so the colliding
//! run is compared with bare on unique ids.
//!
//! Every response is checked: HTTP 200, its own `ECHO:<sentinel>` result and
//! exactly the id that was sent. The summary gives each mode's throughput
//! over all its runs and the median of its per-round ratios to bare (the
//! more robust figure when the machine is shared). Defaults take about 45 s.

mod bare_proxy;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use axum::serve::ListenerExt;
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http::header::{ACCEPT, CONTENT_TYPE};
use http::{HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcp_id_guard::{IdGuardLayer, Stats};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A legacy-session protocol revision: the guard tracks its sessions.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// Where the in-process servers listen: a free loopback port.
const ANY_LOOPBACK_PORT: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
/// A single call may take at most this long; a hang fails the run.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The load generator's settings.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "loadtest",
    about = "End-to-end cost of mcp-id-guard: rmcp's echo server, bare and guarded, under the same closed-loop load"
)]
struct Settings {
    /// Seconds per measured run.
    #[arg(long, env = "LOADTEST_DURATION", default_value = "1.5", value_parser = seconds)]
    duration: Duration,
    /// Rounds; each runs every mode once.
    #[arg(long, env = "LOADTEST_ROUNDS", default_value_t = 8, value_parser = at_least_one)]
    rounds: usize,
    /// Requests in flight at any time.
    #[arg(long, env = "LOADTEST_CONCURRENCY", default_value_t = 64, value_parser = at_least_one)]
    concurrency: usize,
    /// MCP sessions the load is spread over.
    #[arg(long, env = "LOADTEST_SESSIONS", default_value_t = 16, value_parser = at_least_one)]
    sessions: usize,
    /// Seconds of unmeasured load per mode first.
    #[arg(long, env = "LOADTEST_WARMUP", default_value = "1", value_parser = seconds)]
    warmup: Duration,
    /// 1: accepted connections get TCP_NODELAY; 0: axum's defaults (Nagle on,
    /// which adds the client's delayed-ACK wait to every call).
    #[arg(
        long,
        env = "LOADTEST_NODELAY",
        default_value = "1",
        value_parser = zero_or_one,
        action = clap::ArgAction::Set
    )]
    nodelay: bool,
    /// Which runs to make, in this order.
    #[arg(
        long,
        env = "LOADTEST_MODES",
        value_enum,
        value_delimiter = ',',
        default_value = "bare,guarded,colliding"
    )]
    modes: Vec<Mode>,
    /// Serve only the bare echo server on this loopback address (at `/mcp`)
    /// until killed, and generate no load: an upstream for benchmarks that
    /// put another proxy in front of it (`benches/proxy_vs_nginx.sh`).
    #[arg(long, env = "LOADTEST_SERVE", value_parser = loopback_address)]
    serve: Option<SocketAddr>,
    /// Serve only a bare hyper-util reverse proxy on this loopback address,
    /// forwarding to `--upstream`, until killed: hyper's own floor, measured
    /// beside the fronts by `benches/held_vs_nginx.sh`.
    #[arg(long, value_parser = loopback_address, requires = "upstream")]
    bare_proxy: Option<SocketAddr>,
    /// Where `--bare-proxy` forwards to.
    #[arg(long, value_parser = loopback_address)]
    upstream: Option<SocketAddr>,
}

fn loopback_address(text: &str) -> Result<SocketAddr, String> {
    let address: SocketAddr = text.parse().map_err(|error| format!("{error}"))?;
    if address.ip().is_loopback() {
        Ok(address)
    } else {
        Err("the echo server only listens on loopback (127.0.0.1 or [::1])".to_owned())
    }
}

fn seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is not a duration >= 0"))
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(0) | Err(_) => Err(format!("{text:?} is not a whole number >= 1")),
        Ok(number) => Ok(number),
    }
}

fn zero_or_one(text: &str) -> Result<bool, String> {
    match text {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("{text:?}: 0 or 1")),
    }
}

/// The ways the load runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Bare rmcp, unique ids.
    Bare,
    /// Guarded, unique ids.
    Guarded,
    /// Guarded, every id 1 (Remap).
    Colliding,
    /// Bare, but every id is a unique string as long as a server-side id:
    /// what the server's own cost of such ids is, apart from the guard's.
    BareLongIds,
}

impl Mode {
    const ALL: [Mode; 4] = [
        Mode::Bare,
        Mode::Guarded,
        Mode::Colliding,
        Mode::BareLongIds,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Bare => "bare rmcp, unique ids",
            Mode::Guarded => "guarded, unique ids",
            Mode::Colliding => "guarded, colliding ids (Remap)",
            Mode::BareLongIds => "bare rmcp, unique long string ids",
        }
    }
}

/// Arguments of the `echo` tool.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// Answered as `ECHO:<sentinel>`.
    sentinel: String,
}

/// rmcp's per-session handler: one tool, `echo`.
#[derive(Clone)]
struct Echo {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Echo {
    /// Answers `ECHO:<sentinel>`.
    #[tool(description = "Echo a sentinel back as ECHO:<sentinel>")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        format!("ECHO:{}", args.sentinel)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mcp-id-guard-loadtest", "0.0.0"))
    }
}

/// A running server on loopback.
struct Server {
    url: String,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Server {
    /// Serves the echo server, bare or guarded: rmcp's default stateful
    /// config, SSE keep-alive 15 s, `nest_service("/mcp")`, the guard on the
    /// router, with `TCP_NODELAY` unless `nodelay` is off.
    async fn start(
        guard: Option<IdGuardLayer>,
        nodelay: bool,
        address: SocketAddr,
    ) -> anyhow::Result<Self> {
        let shutdown = CancellationToken::new();
        let config = StreamableHttpServerConfig::default()
            .with_sse_keep_alive(Some(Duration::from_secs(15)))
            .with_cancellation_token(shutdown.child_token());
        let echo = Echo {
            tool_router: Echo::tool_router(),
        };
        let rmcp_service: StreamableHttpService<Echo, LocalSessionManager> =
            StreamableHttpService::new(move || Ok(echo.clone()), Default::default(), config);
        let router = axum::Router::new().nest_service("/mcp", rmcp_service);
        let router = match guard {
            Some(layer) => router.layer(layer),
            None => router,
        };
        let listener = tokio::net::TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let listener = listener.tap_io(move |tcp| {
            if nodelay {
                let _ = tcp.set_nodelay(true);
            }
        });
        let serving = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.clone().cancelled_owned());
        let task = tokio::spawn(async move {
            let _ = serving.await;
        });
        Ok(Self {
            url: format!("http://{address}/mcp"),
            shutdown,
            task,
        })
    }

    fn url(&self) -> &str {
        &self.url
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}

/// Polls the guard's counters until nothing is in flight and no session is
/// tracked, or 10 s pass: the guard lets go of an exchange when the server
/// side of its response ends, which may trail what the client saw.
async fn drained_stats(layer: &IdGuardLayer) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = layer.stats();
        if (stats.in_flight_requests == 0 && stats.in_flight_sessions == 0)
            || Instant::now() >= deadline
        {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A server under load and its initialized sessions.
struct Target {
    uri: Uri,
    sessions: Vec<HeaderValue>,
}

/// POSTs a JSON-RPC body and reads the whole response.
async fn post(
    client: &HttpClient,
    uri: &Uri,
    session: Option<&HeaderValue>,
    body: String,
) -> anyhow::Result<(StatusCode, Option<HeaderValue>, Bytes)> {
    let mut request = Request::post(uri.clone())
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", PROTOCOL_VERSION);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session.clone());
    }
    let request = request.body(Full::new(Bytes::from(body)))?;
    let exchange = async {
        let response = client.request(request).await?;
        let status = response.status();
        let session = response.headers().get("mcp-session-id").cloned();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, session, body))
    };
    tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .context("no complete response within the call timeout")?
}

/// `initialize` and `notifications/initialized`: a session in legacy mode.
async fn open_session(client: &HttpClient, uri: &Uri) -> anyhow::Result<HeaderValue> {
    let initialize = format!(
        r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{}","capabilities":{{}},"clientInfo":{{"name":"loadtest","version":"0"}}}}}}"#,
        PROTOCOL_VERSION
    );
    let (status, session, _) = post(client, uri, None, initialize).await?;
    let session = match (status, session) {
        (StatusCode::OK, Some(session)) => session,
        (status, _) => bail!("initialize: {status}, or no session id"),
    };
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned();
    let (status, _, _) = post(client, uri, Some(&session), initialized).await?;
    ensure!(
        status == StatusCode::ACCEPTED,
        "notifications/initialized: {status}"
    );
    Ok(session)
}

/// One `tools/call` of `echo`, checked: HTTP 200, its own result, its own id.
async fn call(
    client: &HttpClient,
    uri: &Uri,
    session: &HeaderValue,
    id: &str,
    sentinel: &str,
) -> anyhow::Result<()> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"sentinel":"{sentinel}"}}}}}}"#
    );
    let (status, _, body) = post(client, uri, Some(session), body).await?;
    ensure!(status == StatusCode::OK, "status {status}");
    let own_result = format!("\"ECHO:{sentinel}\"");
    let own_id = format!("\"id\":{id},");
    let contains = |needle: &str| memchr::memmem::find(&body, needle.as_bytes()).is_some();
    ensure!(
        contains(&own_result) && contains(&own_id),
        "not its own answer: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(())
}

/// What one timed run saw.
#[derive(Debug, Default)]
struct RunResult {
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
    /// Per-request latency, microseconds.
    latencies: Vec<u32>,
}

/// Closed loop: `concurrency` workers, each sending its next request as soon
/// as the previous one is answered, until `duration` has passed.
async fn run(
    client: &HttpClient,
    target: &Arc<Target>,
    mode: Mode,
    settings: &Settings,
    duration: Duration,
    ids: &Arc<AtomicU64>,
) -> RunResult {
    let begun = Instant::now();
    let deadline = begun + duration;
    let workers: Vec<_> = (0..settings.concurrency)
        .map(|worker| {
            let (client, target, ids) = (client.clone(), Arc::clone(target), Arc::clone(ids));
            tokio::spawn(async move {
                let session = &target.sessions[worker % target.sessions.len()];
                let mut result = RunResult::default();
                let mut sentinel = String::new();
                let mut id = String::new();
                while Instant::now() < deadline {
                    let n = ids.fetch_add(1, Ordering::Relaxed);
                    sentinel.clear();
                    id.clear();
                    let _ = write!(sentinel, "w{worker}-{n}");
                    match mode {
                        Mode::Colliding => id.push('1'),
                        Mode::Bare | Mode::Guarded => {
                            let _ = write!(id, "{n}");
                        }
                        Mode::BareLongIds => {
                            let _ = write!(id, "\"mcp-id-guard-lookalike:0123456789abcdef:{n}:1\"");
                        }
                    }
                    let started = Instant::now();
                    let outcome = call(&client, &target.uri, session, &id, &sentinel).await;
                    let micros = started.elapsed().as_micros();
                    match outcome {
                        Ok(()) => {
                            result.requests += 1;
                            result.latencies.push(micros.min(u32::MAX as u128) as u32);
                        }
                        Err(error) => {
                            result.errors += 1;
                            result.first_error.get_or_insert(format!("{error:#}"));
                        }
                    }
                }
                result
            })
        })
        .collect();
    let mut total = RunResult::default();
    for worker in workers {
        let result = worker.await.unwrap_or_else(|error| RunResult {
            errors: 1,
            first_error: Some(format!("worker failed: {error}")),
            ..RunResult::default()
        });
        total.requests += result.requests;
        total.errors += result.errors;
        if total.first_error.is_none() {
            total.first_error = result.first_error;
        }
        total.latencies.extend(result.latencies);
    }
    total.elapsed = begun.elapsed();
    total
}

/// Totals of one mode over all rounds.
#[derive(Debug, Default)]
struct Totals {
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
    latencies: Vec<u32>,
    per_round: Vec<f64>,
}

impl Totals {
    fn add(&mut self, run: RunResult) {
        self.per_round
            .push(run.requests as f64 / run.elapsed.as_secs_f64());
        self.requests += run.requests;
        self.errors += run.errors;
        if self.first_error.is_none() {
            self.first_error = run.first_error;
        }
        self.elapsed += run.elapsed;
        self.latencies.extend(run.latencies);
    }

    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&mut self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        self.latencies.sort_unstable();
        let rank = ((p / 100.0) * (self.latencies.len() - 1) as f64).round() as usize;
        f64::from(self.latencies[rank]) / 1000.0
    }
}

fn main() -> anyhow::Result<()> {
    let settings = Settings::parse();
    // Client and both servers share one runtime with one worker per core,
    // as a server process would have.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match (settings.serve, settings.bare_proxy, settings.upstream) {
        (Some(address), _, _) => runtime.block_on(serve_only(address, settings.nodelay)),
        (None, Some(listen), Some(upstream)) => {
            runtime.block_on(bare_proxy::serve(listen, upstream))
        }
        _ => runtime.block_on(load(settings)),
    }
}

/// The bare echo server alone, until the process is killed: the upstream
/// another proxy is measured in front of.
async fn serve_only(address: SocketAddr, nodelay: bool) -> anyhow::Result<()> {
    let server = Server::start(None, nodelay, address).await?;
    println!("serving {}", server.url());
    std::future::pending::<()>().await;
    Ok(())
}

async fn load(settings: Settings) -> anyhow::Result<()> {
    let begun = Instant::now();
    let layer = IdGuardLayer::new();
    let bare_server = Server::start(None, settings.nodelay, ANY_LOOPBACK_PORT).await?;
    let guarded_server =
        Server::start(Some(layer.clone()), settings.nodelay, ANY_LOOPBACK_PORT).await?;

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(settings.concurrency)
        .build(connector);

    let mut targets = Vec::new();
    for server in [&bare_server, &guarded_server] {
        let uri: Uri = server.url().parse()?;
        let mut sessions = Vec::with_capacity(settings.sessions);
        for _ in 0..settings.sessions {
            sessions.push(open_session(&client, &uri).await?);
        }
        targets.push(Arc::new(Target { uri, sessions }));
    }
    let target = |mode: Mode| match mode {
        Mode::Bare | Mode::BareLongIds => &targets[0],
        Mode::Guarded | Mode::Colliding => &targets[1],
    };
    let ids = Arc::new(AtomicU64::new(1));

    println!(
        "mcp-id-guard loadtest: rmcp 3.11 echo server on loopback, {} in flight over {} sessions, \
         {} rounds x {:?} per mode, {} cores, TCP_NODELAY {}",
        settings.concurrency,
        settings.sessions,
        settings.rounds,
        settings.duration,
        std::thread::available_parallelism().map_or(1, usize::from),
        if settings.nodelay { "on" } else { "off" },
    );
    if !settings.warmup.is_zero() {
        for &mode in &settings.modes {
            let warm = run(
                &client,
                target(mode),
                mode,
                &settings,
                settings.warmup,
                &ids,
            )
            .await;
            ensure!(
                warm.errors == 0,
                "{} failed during warm-up: {:?}",
                mode.name(),
                warm.first_error
            );
        }
    }
    let before = layer.stats();

    let mut totals: [Totals; 4] = Default::default();
    for round in 0..settings.rounds {
        let mut order = settings.modes.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut line = format!("round {}:", round + 1);
        for mode in order {
            let result = run(
                &client,
                target(mode),
                mode,
                &settings,
                settings.duration,
                &ids,
            )
            .await;
            let rate = result.requests as f64 / result.elapsed.as_secs_f64();
            line.push_str(&format!("  {} {:.0}/s", short(mode), rate));
            totals[mode as usize].add(result);
        }
        println!("{line}");
    }
    let after = drained_stats(&layer).await;

    let bare_rate = totals[Mode::Bare as usize].rate();
    let bare_rounds = totals[Mode::Bare as usize].per_round.clone();
    println!();
    println!(
        "| run | requests | errors | requests/s | p50 ms | p99 ms | vs bare, all rounds | vs bare, median of rounds (min..max) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for &mode in &settings.modes {
        let totals = &mut totals[mode as usize];
        let mut ratios: Vec<f64> = totals
            .per_round
            .iter()
            .zip(&bare_rounds)
            .map(|(rate, bare)| rate / bare)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let per_round = match (ratios.first(), ratios.last()) {
            (Some(low), Some(high)) => {
                format!("{:.3} ({low:.3}..{high:.3})", ratios[ratios.len() / 2])
            }
            _ => "-".to_owned(),
        };
        let (p50, p99) = (totals.percentile(50.0), totals.percentile(99.0));
        println!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.3} | {per_round} |",
            mode.name(),
            totals.requests,
            totals.errors,
            totals.rate(),
            p50,
            p99,
            totals.rate() / bare_rate,
        );
    }
    println!();
    println!(
        "guard counters over the measured rounds: passed {}, remapped {}, restored {}, rejected {}; \
         {} left in flight",
        after.passed_total - before.passed_total,
        after.remapped_total - before.remapped_total,
        after.restored_total - before.restored_total,
        after.rejected_total - before.rejected_total,
        after.in_flight_requests,
    );
    println!("finished in {:.1}s", begun.elapsed().as_secs_f64());

    bare_server.stop().await;
    guarded_server.stop().await;

    let failed: Vec<String> = Mode::ALL
        .iter()
        .filter(|mode| totals[**mode as usize].errors > 0)
        .map(|mode| format!("{}: {:?}", mode.name(), totals[*mode as usize].first_error))
        .collect();
    ensure!(failed.is_empty(), "calls failed: {}", failed.join("; "));
    Ok(())
}

fn short(mode: Mode) -> &'static str {
    match mode {
        Mode::Bare => "bare",
        Mode::Guarded => "guarded",
        Mode::Colliding => "colliding",
        Mode::BareLongIds => "bare-long-ids",
    }
}
