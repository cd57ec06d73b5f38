//! One run: the simulated hosts (the upstream MCP server, the guard with
//! the binary's composition, the clients, a checker), built from a seed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use mcp_id_guard::protect::buffer::{BodyBudget, BodyBufferLayer};
use mcp_id_guard::protect::head::HeadLimitLayer;
use mcp_id_guard::protect::host::{HostLayer, HostPolicy};
use mcp_id_guard::protect::metrics::{Metrics, MetricsLayer};
use mcp_id_guard::protect::pace::BodyPaceLayer;
use mcp_id_guard::proxy::{Proxy, ProxyBody};
use mcp_id_guard::server::{ClientBody, Server};
use mcp_id_guard::{IdGuardLayer, OnDuplicate, Stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tower::util::BoxCloneService;
use tower::BoxError;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::faults::{self, faults, Fault};
use crate::net::{SimConnector, SimListener};
use crate::oracle::{Oracle, Outcome};
use crate::relay::{self, RELAY_HOST, RELAY_PORT};
use crate::{attacker, client, poller, upstream};

pub const GUARD_HOST: &str = "guard";
pub const GUARD_PORT: u16 = 8080;
pub const UPSTREAM_HOST: &str = "upstream";

/// What a run is made of; the seed picks everything else.
#[derive(Clone, Debug)]
pub struct Setup {
    /// `false`: the control, the same stack without the guard.
    pub guard: bool,
    /// The guard's policy for duplicates; `None`: the seed's choice.
    pub policy: Option<OnDuplicate>,
    pub clients: usize,
    pub conversations: usize,
    pub turns: usize,
    pub max_tool_ms: u64,
    pub max_think_ms: u64,
    /// The share of calls whose client disconnects before the answer.
    pub disconnect_rate: f64,
    /// The share of calls whose client cancels them before the answer.
    pub cancel_rate: f64,
    /// How often a client that got its answer on the POST's own stream
    /// resumes that stream again from before the answer (`GET` +
    /// `Last-Event-ID` of the priming event): the server replays the answer
    /// it already delivered.
    pub replay_rate: f64,
    /// The share of SSE streams the server closes early for polling.
    pub poll_rate: f64,
    /// How many times a client resumes one call's stream.
    pub max_polls: u32,
    /// Faults: links held (every message waits) for up to `max_hold`
    /// between the guard and the upstream or a client and the guard,
    /// upstream restarts (which forget every session) and guard restarts
    /// (an empty table, the same id secret).
    pub faults: bool,
    pub max_hold: Duration,
    /// The guard's abandoned-id TTL (and restart window, as in the binary):
    /// above the longest tool call, as the docs ask.
    pub ttl: Duration,
    /// The proxy's upstream response and idle timeouts.
    pub upstream_timeout: Duration,
    /// How long a client waits for any one exchange: past it, the request
    /// did not end in time.
    pub client_bound: Duration,
    /// The share of seeds whose stack has a timeout inside the guard
    /// (tower-http's `TimeoutLayer`, between the guard and the proxy),
    /// shorter than the slow tools: it answers `408` while the server runs
    /// on (#28 item 1).
    pub inner_timeout_rate: f64,
    /// The share of seeds whose server labels answers `Content-Encoding:
    /// identity`, `identity, identity` or an empty list: no coding, to be
    /// read and restored (#28 item 3).
    pub codings_rate: f64,
    /// The share of seeds whose server leads bodies with a UTF-8 byte order
    /// mark (which SSE and `fetch` clients skip) and writes an event's
    /// `data:` before its `id:` (#28 item 4).
    pub bom_rate: f64,
    /// The share of seeds whose guard is given an abandoned-id TTL too
    /// large for the clock (`u64::MAX` s, which the binary takes): abandoned
    /// ids are remembered, never forgotten at once (#28 item 5).
    pub huge_ttl_rate: f64,
    /// The share of seeds whose clients hide a session call's revision
    /// behind `Connection` (see [`Quirks::hiding`]).
    pub hiding_rate: f64,
    /// The share of seeds with a slow-body attacker (see
    /// [`Quirks::slow_bodies`]).
    pub slow_bodies_rate: f64,
    /// Under faults, the share of seeds that partition the guard from the
    /// upstream for up to `max_hold`: turmoil drops what is sent meanwhile,
    /// so the connections open then stall for good (the proxy's timeouts
    /// end them) and new ones fail (the proxy's `502`).
    pub partition_rate: f64,
    /// Under faults, the share of seeds in which the proxy sees a tenth of
    /// its upstream connections reset part way through a response, while
    /// the server runs on.
    pub reset_rate: f64,
    /// The share of seeds with the sequential poller (see
    /// [`Quirks::repoll`]).
    pub repoll_rate: f64,
    /// The share of seeds whose clients send batches (see
    /// [`Quirks::batches`]).
    pub batches_rate: f64,
    /// The share of seeds whose clients send hostile ids (see
    /// [`Quirks::hostile`]).
    pub hostile_rate: f64,
    /// The share of seeds whose guard reaches the server through a relay
    /// (see [`Quirks::series`]).
    pub series_rate: f64,
    /// Under faults, the share of seeds that partition a client from the
    /// guard for up to `max_hold`: the connections open then stall for good,
    /// the client gives up on them after its read timeout and goes on
    /// (reusing `id: 1`), while the guard may still be sending the answer.
    pub client_cut_rate: f64,
}

impl Default for Setup {
    fn default() -> Self {
        let upstream_timeout = Duration::from_secs(30);
        Self {
            guard: true,
            policy: None,
            clients: 3,
            conversations: 4,
            turns: 4,
            max_tool_ms: 8_000,
            max_think_ms: 3_000,
            disconnect_rate: 0.1,
            cancel_rate: 0.1,
            replay_rate: 0.2,
            poll_rate: 0.3,
            max_polls: 20,
            faults: true,
            max_hold: Duration::from_secs(20),
            ttl: Duration::from_secs(30),
            upstream_timeout,
            // A JSON answer's head, or an SSE stream's silence, each at most
            // the upstream timeout; a held link; the network's slack.
            client_bound: upstream_timeout * 2 + Duration::from_secs(30),
            inner_timeout_rate: 0.3,
            codings_rate: 0.3,
            bom_rate: 0.3,
            huge_ttl_rate: 0.2,
            hiding_rate: 0.3,
            slow_bodies_rate: 0.3,
            partition_rate: 0.3,
            reset_rate: 0.3,
            repoll_rate: 0.3,
            batches_rate: 0.3,
            hostile_rate: 0.3,
            series_rate: 0.3,
            client_cut_rate: 0.3,
        }
    }
}

/// The parts of the stack and of the server a seed may vary, drawn from an
/// RNG of their own so that the other choices of a seed stay as they were
/// before these were choices.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quirks {
    /// A timeout inside the guard, answering `408` in the server's place.
    pub inner_timeout: Option<Duration>,
    /// The server labels some answers with an identity `Content-Encoding`.
    pub codings: bool,
    /// The server leads some bodies with a byte order mark, `data:` first.
    pub bom: bool,
    /// The guard's abandoned-id TTL is `u64::MAX` seconds.
    pub huge_ttl: bool,
    /// Clients send some calls claiming revision 2026-07-28 with a
    /// `Connection` header that names `MCP-Protocol-Version`: the proxy drops
    /// it, and the server routes the call into the session by id (#42 item
    /// 1). The guard must refuse such calls.
    pub hiding: bool,
    /// An attacker holds bodies announcing the size cap and sends them at
    /// just above the minimum rate, all the while the clients run (#42
    /// item 2): the clients' requests must keep flowing.
    pub slow_bodies: bool,
    /// A client of its own session makes calls one after another, whose
    /// streams the server closes early every time, resumed ones too (#42
    /// item 3, see [`crate::poller`]): each answered call's id must be free
    /// for the next.
    pub repoll: bool,
    /// Each client also sends a few JSON-RPC batches into its session (see
    /// [`crate::batch`]).
    pub batches: bool,
    /// Each client also sends calls with hostile ids into its session (see
    /// [`crate::hostile`]).
    pub hostile: bool,
    /// The guard's proxy reaches the server through a second proxy, without
    /// a guard, whose stand-ins cross HTTP (see [`crate::relay`]).
    pub series: bool,
}

impl Quirks {
    fn of(seed: u64, setup: &Setup) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0ddc_0de5);
        let inner_timeout = rng.random_bool(setup.inner_timeout_rate).then(|| {
            // Shorter than the slow tools (up to `max_tool_ms`).
            Duration::from_millis(rng.random_range(500..=setup.max_tool_ms.max(1_000) * 3 / 4))
        });
        Self {
            inner_timeout,
            codings: rng.random_bool(setup.codings_rate),
            bom: rng.random_bool(setup.bom_rate),
            huge_ttl: rng.random_bool(setup.huge_ttl_rate),
            hiding: rng.random_bool(setup.hiding_rate),
            slow_bodies: rng.random_bool(setup.slow_bodies_rate),
            repoll: rng.random_bool(setup.repoll_rate),
            batches: rng.random_bool(setup.batches_rate),
            hostile: rng.random_bool(setup.hostile_rate),
            series: rng.random_bool(setup.series_rate),
        }
    }
}

/// What one run did.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub policy: Option<OnDuplicate>,
    pub quirks: Quirks,
    pub violations: Vec<String>,
    pub outcomes: std::collections::BTreeMap<Outcome, u64>,
    pub server_requests: u64,
    pub simulated: Duration,
    pub wall: Duration,
    pub stats: Option<Stats>,
    /// The run's story, hashed (see [`Oracle::story`]).
    pub story: u64,
}

/// The body every composition answers with (the control's and the
/// guard's differ in type).
type SimBody = UnsyncBoxBody<Bytes, BoxError>;

/// The per-request stack of the binary (`src/bin/mcp-id-guard/main.rs`),
/// traces aside: metrics, head limit, Host check, body pace, body buffer
/// (the binary's default budgets), the guard, the proxy; in some seeds a
/// timeout between the guard and the proxy, as a user's stack may have.
fn stack(
    proxy: Proxy,
    guard: Option<IdGuardLayer>,
    inner_timeout: Option<Duration>,
    metrics: &Metrics,
) -> BoxCloneService<Request<ClientBody>, Response<SimBody>, Infallible> {
    let hosts = HostPolicy::loopback()
        .allowed_hosts([GUARD_HOST])
        .expect("a valid host pattern");
    let outer = ServiceBuilder::new()
        .layer(MetricsLayer::new(metrics.clone()))
        .layer(HeadLimitLayer::new(32 * 1024))
        .layer(HostLayer::new(hosts))
        .layer(BodyPaceLayer::new().idle_timeout(Some(Duration::from_secs(10))))
        .layer(
            BodyBufferLayer::new(BodyBudget::new(64 * 1024 * 1024))
                .max_body_bytes(4 * 1024 * 1024)
                .per_connection(4 * 1024 * 1024),
        );
    // tower-http's timeout answers an empty `408` once the proxy's head
    // takes longer (a JSON answer's head waits for the tool); the request
    // has reached the server, which runs on. Its body must be `Default`.
    let inner = ServiceBuilder::new()
        .option_layer(inner_timeout.map(|timeout| {
            tower_http::timeout::TimeoutLayer::with_status_code(
                http::StatusCode::REQUEST_TIMEOUT,
                timeout,
            )
        }))
        .map_response(|response: Response<ProxyBody>| {
            response.map(|body| body.map_err(Into::<BoxError>::into).boxed_unsync())
        })
        .service(proxy);
    match guard {
        Some(guard) => boxed(outer.layer(guard).service(inner)),
        None => boxed(outer.service(inner)),
    }
}

fn boxed<S, B>(service: S) -> BoxCloneService<Request<ClientBody>, Response<SimBody>, Infallible>
where
    S: Service<Request<ClientBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    service
        .map_response(|response: Response<B>| {
            response.map(|body| body.map_err(Into::into).boxed_unsync())
        })
        .boxed_clone()
}

/// Runs the world of `seed`.
pub fn run(seed: u64, setup: &Setup) -> Report {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let oracle = Oracle::new();
    let quirks = Quirks::of(seed, setup);
    oracle.note(&format!("quirks: {quirks:?}"));
    // Partitions and resets, from an RNG of their own.
    let mut cuts = StdRng::seed_from_u64(seed ^ 0xc075_c075);
    let resets = setup.faults && cuts.random_bool(setup.reset_rate);
    let (reset_seed, reset_rate): (u64, f64) = (cuts.random(), if resets { 0.1 } else { 0.0 });
    oracle.note(&format!("upstream connections reset: {reset_rate}"));
    let mut sim = turmoil::Builder::new()
        .rng_seed(rng.random())
        .simulation_duration(Duration::from_secs(3600))
        .tick_duration(Duration::from_millis(5))
        .min_message_latency(Duration::from_millis(0))
        .max_message_latency(Duration::from_millis(50))
        // Turmoil panics when a listener's queue of unaccepted connections
        // is full, where a kernel drops the SYN. 64 (its default) is less
        // than the connections a held link can release at once: the proxy's
        // connects while the guard's inner timeout answers every resumed
        // stream in 0.7 s (seed 19150, 23.7 s in).
        .tcp_capacity(4096)
        .build();

    // Each start of the upstream host (a restart too) is a new server that
    // knows no session.
    let upstream_seed: u64 = rng.random();
    let incarnations = std::cell::Cell::new(0);
    let (upstream_oracle, poll_rate) = (oracle.clone(), setup.poll_rate);
    sim.host(UPSTREAM_HOST, move || {
        let incarnation = incarnations.get();
        incarnations.set(incarnation + 1);
        upstream_oracle.note(&format!("upstream: start {incarnation}"));
        upstream::Upstream::new(
            upstream_seed,
            upstream_oracle.clone(),
            poll_rate,
            incarnation,
            quirks,
        )
        .serve()
    });

    let mut secret = [0u8; 16];
    rng.fill(&mut secret);
    // Each start of the guard host (a restart too) is a new process with an
    // empty table, which shares the id secret of the one before (as with
    // `--id-secret-file`) and remaps unseen sessions for its restart window.
    let current_guard: Arc<std::sync::Mutex<Option<IdGuardLayer>>> = Arc::default();
    let stats_of = Arc::clone(&current_guard);
    let (use_guard, window, guard_oracle) = (setup.guard, setup.ttl, oracle.clone());
    // The binary takes `--abandoned-id-ttl` up to `u64::MAX` seconds; the
    // restart window stays as set (`--restart-window`), so that it ends
    // within the run.
    let ttl = if quirks.huge_ttl {
        Duration::from_secs(u64::MAX)
    } else {
        setup.ttl
    };
    // From an RNG of its own, so that the other choices of a seed stay as
    // they were before the policy was one.
    let policy = setup.policy.unwrap_or_else(|| {
        let policies = [OnDuplicate::Remap, OnDuplicate::Queue, OnDuplicate::Reject];
        policies[StdRng::seed_from_u64(seed ^ 0x9011_c1e5).random_range(0..policies.len())]
    });
    oracle.note(&format!("guard policy: {policy:?}"));
    let upstream_timeout = setup.upstream_timeout;
    let guard_starts = std::cell::Cell::new(0u32);
    sim.host(GUARD_HOST, move || {
        let layer = IdGuardLayer::with_secret(secret)
            .on_duplicate(policy)
            .abandoned_id_ttl(ttl)
            .restart_window(window);
        *current_guard.lock().unwrap() = Some(layer.clone());
        guard_oracle.guard_started();
        let incarnation = guard_starts.get();
        guard_oracle.note(&format!("guard: start {incarnation}"));
        guard_starts.set(incarnation + 1);
        let guard = use_guard.then_some(layer);
        async move {
            // Through the relay, the relay's connections are the ones reset.
            let (target, resets) = if quirks.series {
                (format!("http://{RELAY_HOST}:{RELAY_PORT}"), 0.0)
            } else {
                (
                    format!("http://{UPSTREAM_HOST}:{}", upstream::PORT),
                    reset_rate,
                )
            };
            let proxy = Proxy::builder()
                .connector(SimConnector::new(
                    StdRng::seed_from_u64(reset_seed ^ u64::from(incarnation)),
                    resets,
                ))
                .connect_timeout(Duration::from_secs(5))
                .response_timeout(Some(upstream_timeout))
                .idle_timeout(Some(upstream_timeout))
                .max_connections(Some(256))
                .build(&target)?;
            let metrics = Metrics::new();
            let service = stack(proxy, guard, quirks.inner_timeout, &metrics);
            let server = Server::builder()
                .header_read_timeout(Some(Duration::from_secs(10)))
                .keep_alive_timeout(Some(Duration::from_secs(20)))
                .send_timeout(Some(Duration::from_secs(30)))
                .max_connections(512)
                .metrics(metrics)
                .build();
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GUARD_PORT)).await?;
            server
                .serve(
                    SimListener(listener),
                    move |_client| service.clone(),
                    std::future::pending(),
                )
                .await;
            Ok(())
        }
    });

    if quirks.series {
        let relay_starts = std::cell::Cell::new(0u64);
        let (relay_oracle, faults_on) = (oracle.clone(), setup.faults);
        sim.host(RELAY_HOST, move || {
            let incarnation = relay_starts.get();
            relay_starts.set(incarnation + 1);
            relay_oracle.note(&format!("relay: start {incarnation}"));
            // Besides the seed's resets mid-response, under faults a fifth of
            // its connections is reset before a response head completes:
            // its `502` for a request the server runs on.
            let (rate, within) = if reset_rate > 0.0 {
                (reset_rate, 2_000)
            } else if faults_on {
                (0.2, 64)
            } else {
                (0.0, 0)
            };
            let connector = SimConnector::new(
                StdRng::seed_from_u64(reset_seed ^ 0x4e1a ^ incarnation),
                rate,
            )
            .within(within.max(1));
            // Its 504 comes before the guard's proxy would give up.
            let timeout = upstream_timeout.saturating_sub(Duration::from_secs(5));
            relay::serve(
                format!("http://{UPSTREAM_HOST}:{}", upstream::PORT),
                connector,
                timeout,
            )
        });
    }

    // One permit per client that has finished, and its session.
    let done = Arc::new(tokio::sync::Semaphore::new(0));
    let sessions = Arc::new(std::sync::Mutex::new(Vec::new()));
    // The clients know the policy they face (the batches' promises follow
    // it); without the guard, nothing refuses.
    let clients_setup = Setup {
        policy: Some(if setup.guard {
            policy
        } else {
            OnDuplicate::Remap
        }),
        ..setup.clone()
    };
    for index in 0..setup.clients {
        let name = format!("client-{index}");
        let client_seed = rng.random();
        let (setup, oracle, done, sessions) = (
            clients_setup.clone(),
            oracle.clone(),
            Arc::clone(&done),
            Arc::clone(&sessions),
        );
        sim.client(name.clone(), async move {
            let result = client::run(name, setup, quirks, client_seed, oracle).await;
            if let Ok(used) = &result {
                sessions.lock().unwrap().extend(used.iter().cloned());
            }
            done.add_permits(1);
            result.map(drop)
        });
    }

    // The sequential poller counts as a client: the checker waits for it.
    let clients = setup.clients + usize::from(quirks.repoll);
    if quirks.repoll {
        // From an RNG of its own: the seed's faults stay as they were.
        let client_seed = StdRng::seed_from_u64(seed ^ 0x9011_e4ed).random();
        let (setup, oracle, done, sessions) = (
            setup.clone(),
            oracle.clone(),
            Arc::clone(&done),
            Arc::clone(&sessions),
        );
        sim.client(poller::NAME, async move {
            let result = poller::run(setup, quirks, client_seed, oracle).await;
            if let Ok(used) = &result {
                sessions.lock().unwrap().extend(used.iter().cloned());
            }
            done.add_permits(1);
            result.map(drop)
        });
    }

    // The slow-body attacker, for as long as the clients run.
    let clients_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if quirks.slow_bodies {
        let (oracle, clients_done) = (oracle.clone(), Arc::clone(&clients_done));
        sim.client("attacker", async move {
            attacker::hold_bodies(&clients_done, &oracle).await;
            Ok(())
        });
    }

    // Once every client is done: nothing in flight; once the TTL has
    // passed, nothing left at all.
    let final_stats = Arc::new(std::sync::Mutex::new(None));
    // When the last hold of a client's link to the guard lets go (the
    // faults are drawn below, after the hosts, so that each seed's draws
    // stay as they were).
    let clients_heal = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    {
        let (setup, oracle, done, final_stats) = (
            setup.clone(),
            oracle.clone(),
            Arc::clone(&done),
            Arc::clone(&final_stats),
        );
        let sessions = Arc::clone(&sessions);
        let clients_done = Arc::clone(&clients_done);
        let cut = faults::client_cut(seed, &setup).is_some();
        let clients_heal = Arc::clone(&clients_heal);
        sim.client("checker", async move {
            let started = tokio::time::Instant::now();
            let clients = u32::try_from(clients).expect("a few clients");
            let _all = done.acquire_many(clients).await?;
            clients_done.store(true, std::sync::atomic::Ordering::Relaxed);
            // A client's link to the guard still held keeps what the client
            // sent last (the end of a connection it gave up) from the guard
            // until the link lets go: wait for that first.
            let heal = *clients_heal.lock().unwrap();
            tokio::time::sleep_until(started + heal).await;
            // The last bodies' ends reach the guard. A client cut off from
            // the guard left requests the guard cannot know were given up
            // (the connection's end was lost): they end with the server's
            // answer, or the proxy's timeouts.
            let settle = if cut {
                setup.upstream_timeout + Duration::from_secs(1)
            } else {
                Duration::from_secs(1)
            };
            tokio::time::sleep(settle).await;
            // The guard running now (a restarted one's table starts empty).
            let guard = stats_of.lock().unwrap().clone().filter(|_| setup.guard);
            if let Some(guard) = guard {
                let stats = guard.stats();
                if stats.in_flight_requests != 0 {
                    oracle.violation(format!(
                        "{} requests still in flight after the traffic stopped",
                        stats.in_flight_requests
                    ));
                }
                // Every tool has ended by now (the longest is shorter
                // than the TTL), so every abandoned id is past its time;
                // the table drops them as each session is next used.
                tokio::time::sleep(setup.ttl + Duration::from_secs(1)).await;
                let sessions = sessions.lock().unwrap().clone();
                match client::touch_window().await {
                    Ok(status) => oracle.note(&format!("last touch of the window: {status}")),
                    Err(error) => oracle.note(&format!("last touch of the window failed: {error}")),
                }
                for session in &sessions {
                    // Any answer will do (a 404 from a restarted server, a
                    // 502 across a held link): the guard has looked at the
                    // session's ids on the way.
                    // A connection the guard's restart broke: again.
                    for _ in 0..5 {
                        match client::touch(session).await {
                            Ok(status) => {
                                oracle.note(&format!("last touch: {status}"));
                                break;
                            }
                            Err(error) => oracle.note(&format!("last touch failed: {error}")),
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                // The guard running now: one restarted meanwhile has a
                // table of its own (the old one went with its process).
                let guard = stats_of.lock().unwrap().clone().unwrap_or(guard);
                let stats = guard.stats();
                // Under a TTL of `u64::MAX` s an abandoned id is remembered
                // for the process's life (a century): what was abandoned
                // stays, and only the in-flight count must be back to zero.
                // The early freeing such a TTL once caused shows as the
                // server running a duplicate instead.
                let remembered = quirks.huge_ttl;
                if stats.in_flight_requests != 0
                    || (!remembered && (stats.abandoned_ids != 0 || stats.table_bytes != 0))
                {
                    oracle.violation(format!(
                        "the table is not empty a TTL after the traffic stopped: {stats:?}"
                    ));
                }
                *final_stats.lock().unwrap() = Some(stats);
            }
            Ok(())
        });
    }

    let gateway = if quirks.series {
        RELAY_HOST
    } else {
        GUARD_HOST
    };
    let faults = faults(seed, &mut rng, &mut cuts, setup, gateway);
    *clients_heal.lock().unwrap() = faults
        .iter()
        .filter_map(|(at, fault)| match fault {
            Fault::Release(_, to) if to == GUARD_HOST => Some(*at),
            _ => None,
        })
        .max()
        .unwrap_or_default();
    let mut next = 0;
    loop {
        while let Some((_, fault)) = faults.get(next).filter(|(at, _)| sim.elapsed() >= *at) {
            // Told from outside the simulation: its time in the text.
            oracle.note(&format!(
                "fault at {:.3} s: {fault:?}",
                sim.elapsed().as_secs_f64()
            ));
            match fault {
                Fault::Hold(a, b) => sim.hold(a.as_str(), b.as_str()),
                Fault::Partition => sim.partition(gateway, UPSTREAM_HOST),
                Fault::Repair => sim.repair(gateway, UPSTREAM_HOST),
                Fault::Cut(client) => sim.partition(client.as_str(), GUARD_HOST),
                Fault::Heal(client) => sim.repair(client.as_str(), GUARD_HOST),
                Fault::Release(a, b) => sim.release(a.as_str(), b.as_str()),
                Fault::RestartUpstream => sim.bounce(UPSTREAM_HOST),
                Fault::RestartGuard => sim.bounce(GUARD_HOST),
            }
            next += 1;
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => {
                oracle.violation(format!("the simulation failed: {error}"));
                break;
            }
        }
    }
    let report = Report {
        seed,
        policy: setup.guard.then_some(policy),
        quirks,
        violations: oracle.violations(),
        outcomes: oracle.outcomes(),
        server_requests: oracle.requests_started(),
        simulated: sim.elapsed(),
        wall: started.elapsed(),
        stats: final_stats.lock().unwrap().take(),
        story: oracle.story(),
    };
    report
}
