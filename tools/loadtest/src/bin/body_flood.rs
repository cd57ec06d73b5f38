//! A request-body flood against a running `mcp-id-guard` proxy (issue 42's
//! acceptance run), measuring what legitimate clients get meanwhile.
//!
//! ```text
//! body_flood --proxy 127.0.0.1:P --admin 127.0.0.1:A --proxy-pid PID \
//!     --connections 1024 --sources 256 --protocol h2 --mode min-rate --duration 120
//! ```
//!
//! It starts nothing itself (`benches/body_flood.sh` starts the upstream and
//! the proxy). `--connections` attackers, each on its own connection, from
//! 127.0.0.1 (`--sources 1`) or spread over 127.0.0.1..=127.0.1.0
//! (`--sources 256`), over HTTP/1.1 (raw TCP writes) or HTTP/2 (hyper's
//! client, one connection per attacker), each POST announcing
//! `Content-Length: 4194304` (the size cap) and then either
//!
//! - `min-rate`: trickling `--rate` bytes per second (250, just above the
//!   proxy's 240 B/s minimum) in one write a second, or
//! - `zero-byte`: sending no body byte at all, and opening a new such
//!   request as soon as the old one is answered or its connection closes
//!   (re-reserving whatever a request holds before its first byte).
//!
//! An attacker whose request is answered (503, 408) or whose connection
//! closes starts over, so the flood is held for the whole run. Meanwhile a
//! legitimate client, from its own address (`--legit-source`, 127.0.2.1:
//! the attacker's address is not the victim's), in one MCP session it
//! initialized through the proxy, sends a 40-byte ping every 200 ms and a
//! 1 MiB ping (the 40 bytes padded with JSON whitespace) every 2 s, each
//! with a 2 s deadline. A request counts as answered if its whole response
//! arrived within the deadline with a status that is not the proxy's
//! refusal (503, 408, 413, 429) or a gateway error (502, 504). Every second
//! the proxy's RSS (`/proc/PID/status`, VmRSS) and the admin `/metrics`
//! gauges `mcp_id_guard_held_request_body_bytes` and
//! `mcp_id_guard_held_request_bodies` are sampled. One summary line is
//! printed at the end, with `PASS` or `FAIL` against the criteria: 95 % of
//! pings and 90 % of 1 MiB POSTs answered within 2 s, peak RSS under the
//! body budget (`--budget-mib`, 64) plus 32 MiB. Every loop ends with the
//! run.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{sleep, sleep_until, timeout, Instant};

/// What each attacking body announces: the proxy's size cap, 4 MiB.
const ANNOUNCED: usize = 4 * 1024 * 1024;
/// A legitimate request's deadline.
const DEADLINE: Duration = Duration::from_secs(2);
/// Legacy-session protocol revision.
const PROTOCOL_VERSION: &str = "2025-06-18";
const ACCEPT: &str = "application/json, text/event-stream";
/// The 1 MiB legitimate body's size.
const LARGE: usize = 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    H1,
    H2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Trickle `--rate` bytes a second.
    MinRate,
    /// Send no body byte; renew each request when it is answered or closed.
    ZeroByte,
}

/// The flood's settings.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "body_flood",
    about = "A slow request-body flood against a running mcp-id-guard, with legitimate pings and 1 MiB POSTs meanwhile"
)]
struct Settings {
    /// The proxy's client listener.
    #[arg(long)]
    proxy: SocketAddr,
    /// The proxy's admin listener (`/metrics`).
    #[arg(long)]
    admin: SocketAddr,
    /// The proxy's process id (its RSS is read from /proc).
    #[arg(long)]
    proxy_pid: u32,
    /// Attacker connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Source addresses of the attack: 1 (127.0.0.1) or up to 256
    /// (127.0.0.1..=127.0.1.0).
    #[arg(long, default_value_t = 1)]
    sources: u32,
    #[arg(long, value_enum, default_value = "h1")]
    protocol: Protocol,
    #[arg(long, value_enum, default_value = "min-rate")]
    mode: Mode,
    /// Seconds the flood is held.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Bytes per second of each attacking body in `min-rate` mode.
    #[arg(long, default_value_t = 250)]
    rate: usize,
    /// The legitimate client's address.
    #[arg(long, default_value = "127.0.2.1")]
    legit_source: Ipv4Addr,
    /// The proxy's body budget in MiB (the RSS criterion is this plus 32).
    #[arg(long, default_value_t = 64)]
    budget_mib: u64,
}

/// A request body fed by a channel: bytes as the attacker decides to send them.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|slice| slice.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// What the attackers got.
#[derive(Default)]
struct AttackStats {
    requests: AtomicU64,
    connections: AtomicU64,
    connect_errors: AtomicU64,
    /// Closed or reset without an answer.
    closed: AtomicU64,
    bytes_sent: AtomicU64,
    answers: Mutex<BTreeMap<u16, u64>>,
}

impl AttackStats {
    fn answered(&self, status: u16) {
        *self.answers.lock().unwrap().entry(status).or_default() += 1;
    }
}

/// What one kind of legitimate request got.
#[derive(Default)]
struct Legit {
    total: u64,
    ok: u64,
    latencies_ms: Vec<f64>,
    /// Status (or 0: error, 1: over the deadline) -> count.
    outcomes: BTreeMap<u16, u64>,
}

impl Legit {
    fn record(&mut self, outcome: Option<(u16, Duration)>) {
        self.total += 1;
        match outcome {
            Some((status, took)) => {
                *self.outcomes.entry(status).or_default() += 1;
                self.latencies_ms.push(took.as_secs_f64() * 1e3);
                if took <= DEADLINE && !matches!(status, 408 | 413 | 429 | 502 | 503 | 504) {
                    self.ok += 1;
                }
            }
            None => *self.outcomes.entry(1).or_default() += 1,
        }
    }

    fn percentile(&mut self, p: f64) -> f64 {
        if self.latencies_ms.is_empty() {
            return f64::NAN;
        }
        self.latencies_ms.sort_by(f64::total_cmp);
        let index = ((self.latencies_ms.len() - 1) as f64 * p).round() as usize;
        self.latencies_ms[index]
    }

    fn share(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.ok as f64 / self.total as f64
        }
    }

    fn outcomes(&self) -> String {
        let parts: Vec<String> = self
            .outcomes
            .iter()
            .map(|(status, count)| match status {
                1 => format!("late/err:{count}"),
                _ => format!("{status}:{count}"),
            })
            .collect();
        parts.join(",")
    }
}

fn source(settings: &Settings, attacker: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(127, 0, 0, 1));
    let spread = settings.sources.clamp(1, 256);
    Ipv4Addr::from(base + attacker as u32 % spread)
}

async fn connect_from(source: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    let stream = timeout(Duration::from_secs(5), socket.connect(to))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// The body bytes of one second: the first slice opens the JSON.
fn slice(rate: usize, first: bool) -> Bytes {
    let mut bytes = vec![b' '; rate.max(1)];
    if first {
        bytes[0] = b'{';
    }
    Bytes::from(bytes)
}

/// One HTTP/1.1 attacker: raw writes, a new connection per request.
async fn attack_h1(
    settings: Arc<Settings>,
    attacker: usize,
    end: Instant,
    stats: Arc<AttackStats>,
) {
    let from = source(&settings, attacker);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: {ACCEPT}\r\nMcp-Session-Id: attack-{attacker}\r\nContent-Length: {ANNOUNCED}\r\n\r\n",
        settings.proxy
    );
    while Instant::now() < end {
        let stream = match connect_from(from, settings.proxy).await {
            Ok(stream) => stream,
            Err(_) => {
                stats.connect_errors.fetch_add(1, Ordering::Relaxed);
                sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let (mut reader, mut writer) = stream.into_split();
        if writer.write_all(head.as_bytes()).await.is_err() {
            stats.closed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut first = true;
        let mut buffer = [0u8; 512];
        loop {
            tokio::select! {
                read = reader.read(&mut buffer) => {
                    match read {
                        Ok(n) if n >= 12 && buffer.starts_with(b"HTTP/1.1 ") => {
                            let status = std::str::from_utf8(&buffer[9..12])
                                .ok()
                                .and_then(|code| code.parse().ok())
                                .unwrap_or(0);
                            stats.answered(status);
                        }
                        _ => {
                            stats.closed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    break;
                }
                _ = tick.tick(), if settings.mode == Mode::MinRate => {
                    let bytes = slice(settings.rate, first);
                    first = false;
                    if writer.write_all(&bytes).await.is_err() {
                        stats.closed.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    stats.bytes_sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
                _ = sleep_until(end) => return,
            }
        }
    }
}

/// One HTTP/2 attacker: one connection, one stream at a time on it, a new
/// stream (or connection) whenever the old one is answered or reset.
async fn attack_h2(
    settings: Arc<Settings>,
    attacker: usize,
    end: Instant,
    stats: Arc<AttackStats>,
) {
    let from = source(&settings, attacker);
    let uri = format!("http://{}/mcp", settings.proxy);
    'connection: while Instant::now() < end {
        let stream = match connect_from(from, settings.proxy).await {
            Ok(stream) => stream,
            Err(_) => {
                stats.connect_errors.fetch_add(1, Ordering::Relaxed);
                sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handshake =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream));
        let (mut sender, connection) = match timeout(Duration::from_secs(5), handshake).await {
            Ok(Ok(pair)) => pair,
            _ => {
                stats.connect_errors.fetch_add(1, Ordering::Relaxed);
                sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let driver = tokio::spawn(connection);
        loop {
            if Instant::now() >= end {
                break 'connection;
            }
            if !matches!(
                timeout(Duration::from_secs(5), sender.ready()).await,
                Ok(Ok(()))
            ) {
                stats.closed.fetch_add(1, Ordering::Relaxed);
                driver.abort();
                continue 'connection;
            }
            let (feed, body) = mpsc::channel(4);
            let request = Request::post(&uri)
                .header("content-type", "application/json")
                .header("accept", ACCEPT)
                .header("mcp-session-id", format!("attack-{attacker}"))
                .header("content-length", ANNOUNCED.to_string())
                .body(ChannelBody(body))
                .expect("a valid request");
            stats.requests.fetch_add(1, Ordering::Relaxed);
            let response = sender.send_request(request);
            tokio::pin!(response);
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut first = true;
            let outcome = loop {
                tokio::select! {
                    outcome = &mut response => break outcome,
                    _ = tick.tick(), if settings.mode == Mode::MinRate => {
                        let bytes = slice(settings.rate, first);
                        first = false;
                        let length = bytes.len() as u64;
                        if feed.try_send(bytes).is_ok() {
                            stats.bytes_sent.fetch_add(length, Ordering::Relaxed);
                        }
                    }
                    _ = sleep_until(end) => break 'connection,
                }
            };
            match outcome {
                Ok(response) => stats.answered(response.status().as_u16()),
                Err(_) => {
                    stats.closed.fetch_add(1, Ordering::Relaxed);
                }
            }
            if sender.is_closed() {
                driver.abort();
                continue 'connection;
            }
        }
    }
}

type LegitClient = Client<HttpConnector, Full<Bytes>>;

fn legit_client(settings: &Settings) -> LegitClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_local_address(Some(IpAddr::V4(settings.legit_source)));
    let mut builder = Client::builder(TokioExecutor::new());
    builder.pool_idle_timeout(Duration::from_secs(30));
    if settings.protocol == Protocol::H2 {
        builder.http2_only(true);
    }
    builder.build(connector)
}

/// A POST of `body`, answered whole: status, the session id if any, and how long.
async fn legit_post(
    client: &LegitClient,
    uri: &str,
    session: Option<&HeaderValue>,
    body: Bytes,
) -> anyhow::Result<(u16, Option<HeaderValue>, Duration)> {
    let started = Instant::now();
    let mut request = Request::post(uri)
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .header("mcp-protocol-version", PROTOCOL_VERSION);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session.clone());
    }
    let response = client.request(request.body(Full::new(body))?).await?;
    let status = response.status().as_u16();
    let session = response.headers().get("mcp-session-id").cloned();
    response.into_body().collect().await?;
    Ok((status, session, started.elapsed()))
}

async fn open_session(client: &LegitClient, uri: &str) -> anyhow::Result<HeaderValue> {
    let initialize = format!(
        r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":{{}},"clientInfo":{{"name":"body_flood","version":"0"}}}}}}"#
    );
    let (status, session, _) = timeout(
        Duration::from_secs(10),
        legit_post(client, uri, None, Bytes::from(initialize)),
    )
    .await
    .context("initialize timed out")??;
    let Some(session) = session.filter(|_| status == 200) else {
        bail!("initialize: {status}, or no session id");
    };
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (status, _, _) = timeout(
        Duration::from_secs(10),
        legit_post(
            client,
            uri,
            Some(&session),
            Bytes::from_static(initialized.as_bytes()),
        ),
    )
    .await
    .context("initialized timed out")??;
    if status != 202 && status != 200 {
        bail!("notifications/initialized: {status}");
    }
    Ok(session)
}

/// Sends a request every `every` until `end`, each with the deadline.
async fn legit_loop(
    client: LegitClient,
    uri: String,
    session: HeaderValue,
    every: Duration,
    size: usize,
    end: Instant,
    record: Arc<Mutex<Legit>>,
) {
    let mut tick = tokio::time::interval(every);
    let mut id: u64 = if size > 100 { 1_000_000_000 } else { 1 };
    let mut tasks = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = sleep_until(end) => break,
        }
        id += 1;
        let mut body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping""#).into_bytes();
        if size > body.len() + 1 {
            body.resize(size - 1, b' ');
        }
        body.push(b'}');
        let (client, uri, session, record) =
            (client.clone(), uri.clone(), session.clone(), record.clone());
        tasks.push(tokio::spawn(async move {
            let outcome = timeout(
                DEADLINE + Duration::from_millis(500),
                legit_post(&client, &uri, Some(&session), Bytes::from(body)),
            )
            .await;
            let outcome = match outcome {
                Ok(Ok((status, _, took))) => Some((status, took)),
                _ => None,
            };
            record.lock().unwrap().record(outcome);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

#[derive(Default)]
struct Peaks {
    rss_kib: u64,
    held_bytes: f64,
    held_bodies: f64,
    samples: u64,
    metric_errors: u64,
}

async fn sample(settings: Arc<Settings>, end: Instant, peaks: Arc<Mutex<Peaks>>) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let uri = format!("http://{}/metrics", settings.admin);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = sleep_until(end) => break,
        }
        let rss = rss_kib(settings.proxy_pid).unwrap_or(0);
        let metrics = async {
            let request = Request::get(&uri).body(Full::new(Bytes::new()))?;
            let response = client.request(request).await?;
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok(String::from_utf8_lossy(&body).into_owned())
        };
        let metrics = timeout(Duration::from_secs(1), metrics).await;
        let mut peaks = peaks.lock().unwrap();
        peaks.samples += 1;
        peaks.rss_kib = peaks.rss_kib.max(rss);
        match metrics {
            Ok(Ok(text)) => {
                let bytes = gauge(&text, "mcp_id_guard_held_request_body_bytes");
                let bodies = gauge(&text, "mcp_id_guard_held_request_bodies");
                match (bytes, bodies) {
                    (Some(bytes), Some(bodies)) => {
                        peaks.held_bytes = peaks.held_bytes.max(bytes);
                        peaks.held_bodies = peaks.held_bodies.max(bodies);
                    }
                    _ => peaks.metric_errors += 1,
                }
            }
            _ => peaks.metric_errors += 1,
        }
    }
}

fn main() -> anyhow::Result<()> {
    let settings = Settings::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(flood(Arc::new(settings)))
}

async fn flood(settings: Arc<Settings>) -> anyhow::Result<()> {
    let uri = format!("http://{}/mcp", settings.proxy);
    let client = legit_client(&settings);
    let session = open_session(&client, &uri).await?;
    let base_rss = rss_kib(settings.proxy_pid).context("the proxy's /proc status")?;

    let start = Instant::now();
    let end = start + Duration::from_secs(settings.duration);
    let attack = Arc::new(AttackStats::default());
    let mut attackers = Vec::new();
    for attacker in 0..settings.connections {
        let (settings, attack) = (settings.clone(), attack.clone());
        attackers.push(tokio::spawn(async move {
            match settings.protocol {
                Protocol::H1 => attack_h1(settings, attacker, end, attack).await,
                Protocol::H2 => attack_h2(settings, attacker, end, attack).await,
            }
        }));
    }
    let peaks = Arc::new(Mutex::new(Peaks::default()));
    let sampler = tokio::spawn(sample(settings.clone(), end, peaks.clone()));
    let pings = Arc::new(Mutex::new(Legit::default()));
    let large = Arc::new(Mutex::new(Legit::default()));
    // The legitimate load starts once the attackers have had a moment to connect.
    sleep(Duration::from_secs(1)).await;
    let ping_loop = tokio::spawn(legit_loop(
        client.clone(),
        uri.clone(),
        session.clone(),
        Duration::from_millis(200),
        40,
        end,
        pings.clone(),
    ));
    let large_loop = tokio::spawn(legit_loop(
        client.clone(),
        uri.clone(),
        session.clone(),
        Duration::from_secs(2),
        LARGE,
        end,
        large.clone(),
    ));
    ping_loop.await?;
    large_loop.await?;
    sampler.await?;
    for attacker in attackers {
        attacker.abort();
    }

    let mut pings = pings.lock().unwrap();
    let mut large = large.lock().unwrap();
    let peaks = peaks.lock().unwrap();
    let (p50, p99) = (pings.percentile(0.5), pings.percentile(0.99));
    let (l50, lmax) = (large.percentile(0.5), large.percentile(1.0));
    let rss_mib = peaks.rss_kib as f64 / 1024.0;
    let rss_limit = (settings.budget_mib + 32) as f64;
    let pass = pings.share() >= 0.95 && large.share() >= 0.90 && rss_mib < rss_limit;
    let answers: Vec<String> = attack
        .answers
        .lock()
        .unwrap()
        .iter()
        .map(|(status, count)| format!("{status}:{count}"))
        .collect();
    println!(
        "flood {proto} sources={sources} conns={conns} mode={mode} dur={dur}s | pings {po}/{pt} ({pp:.1}%) p50={p50:.1}ms p99={p99:.1}ms [{pout}] | 1MiB {lo}/{lt} ({lp:.1}%) p50={l50:.1}ms max={lmax:.1}ms [{lout}] | RSS peak {rss:.1} MiB (before {base:.1}, limit {rss_limit:.0}) | held peak {hb:.2} MiB, {hn:.0} bodies | attack: conns={ac} reqs={ar} answered=[{ans}] closed={acl} connect_err={ace} sent={sent:.0} KiB | samples={samples} metric_err={merr} | {verdict}",
        proto = match settings.protocol { Protocol::H1 => "h1", Protocol::H2 => "h2" },
        sources = settings.sources,
        conns = settings.connections,
        mode = match settings.mode { Mode::MinRate => "min-rate", Mode::ZeroByte => "zero-byte" },
        dur = settings.duration,
        po = pings.ok,
        pt = pings.total,
        pp = pings.share() * 100.0,
        pout = pings.outcomes(),
        lo = large.ok,
        lt = large.total,
        lp = large.share() * 100.0,
        lout = large.outcomes(),
        rss = rss_mib,
        base = base_rss as f64 / 1024.0,
        hb = peaks.held_bytes / (1024.0 * 1024.0),
        hn = peaks.held_bodies,
        ac = attack.connections.load(Ordering::Relaxed),
        ar = attack.requests.load(Ordering::Relaxed),
        ans = answers.join(","),
        acl = attack.closed.load(Ordering::Relaxed),
        ace = attack.connect_errors.load(Ordering::Relaxed),
        sent = attack.bytes_sent.load(Ordering::Relaxed) as f64 / 1024.0,
        samples = peaks.samples,
        merr = peaks.metric_errors,
        verdict = if pass { "PASS" } else { "FAIL" },
    );
    Ok(())
}
