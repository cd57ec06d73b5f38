//! The reference deployment for more than one replica (`deploy/haproxy/`):
//! a real HAProxy, run from the committed `haproxy.cfg` with its ports filled
//! in, in front of two `mcp-id-guard` processes, each in front of the same
//! rmcp 3.11 echo server. Through HAProxy a session sticks to the replica that
//! saw its `initialize` answer, so the seed's burst, a cancellation, a resumed
//! stream and a restart of that replica all behave as with one proxy. HAProxy
//! health-checks the replicas' `/readyz`: while a session's replica is down
//! the session gets HAProxy's JSON-RPC `503` (never another replica), and new
//! sessions open on the replica that is up.
//!
//! Controls: the burst through HAProxy straight to the bare server
//! cross-wires, and without the stick rules (round-robin, the
//! `--rewrite-all-ids` fallback) a cancellation that lands on the other
//! replica is lost. Without `option persist`, a session whose replica is
//! DOWN is answered by the other replica (HAProxy's default failover). Run by
//! hand and recorded in `deploy/haproxy/README.md`: the replica-down test
//! fails against the previous config (HAProxy's HTML 503) and without the
//! health checks (new sessions land on the dead replica).
//!
//! They need HAProxy (`deploy/haproxy/install.sh` installs it). Where
//! `haproxy` cannot be found, each test writes one `skipped: ...` line and
//! passes, so that the README's `cargo test --all-features` works on a
//! machine with only Rust; with `MCP_ID_GUARD_REQUIRE_HAPROXY=1` (which
//! `.ci/run` sets) a missing HAProxy fails them instead, so CI cannot go
//! green without running them. Every child process is killed when its
//! handle drops, on every exit path.
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _};
use futures::future::join_all;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::mpsc;

use crate::support::client::{Call, Outcome as CallOutcome, Session, Tally};
use crate::support::proxy::{control_burst, sentinels, Outcome, BURST};
use crate::support::server::{dead_port, upstream, McpServer};
use crate::support::{OK_TIMEOUT, WAIT_TIMEOUT};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-id-guard");
/// The committed template, exactly as operators get it.
const TEMPLATE: &str = include_str!("../../deploy/haproxy/haproxy.cfg");

/// Set to `1` to make a missing HAProxy fail these tests rather than skip
/// them (`.ci/run` does).
const REQUIRE_HAPROXY: &str = "MCP_ID_GUARD_REQUIRE_HAPROXY";

/// Whether `test` must be skipped because `haproxy` is not on `PATH`; an
/// error if it is missing while [`REQUIRE_HAPROXY`] is `1`, or cannot be run.
///
/// The test harness has no way to count a test as skipped once it runs, and
/// it captures what `println!`/`eprintln!` write (shown only for failing
/// tests or with `--nocapture`). So the skip is one line written to the
/// process's stderr handle directly, past that capture: it shows in plain
/// `cargo test` output next to the test's `ok`.
fn skip_without_haproxy(test: &str) -> anyhow::Result<bool> {
    skip_without_haproxy_for(&format!("replicas::{test}"))
}

/// [`skip_without_haproxy`] for a test of another module, named in full
/// (`module::test`).
pub(crate) fn skip_without_haproxy_for(test: &str) -> anyhow::Result<bool> {
    let status = std::process::Command::new("haproxy")
        .arg("-v")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let missing = match status {
        Ok(_) => return Ok(false),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => error,
        Err(error) => return Err(error).context("cannot run `haproxy -v`"),
    };
    if std::env::var_os(REQUIRE_HAPROXY).is_some_and(|value| value == "1") {
        bail!(
            "{REQUIRE_HAPROXY}=1 but `haproxy` cannot be run ({missing}): install it with \
             deploy/haproxy/install.sh (as root)"
        );
    }
    // Best effort: a skip line that cannot be written changes nothing.
    let _ = writeln!(
        std::io::stderr().lock(),
        "skipped: {test} needs HAProxy (install it with deploy/haproxy/install.sh)"
    );
    Ok(true)
}

/// Collects a child's stderr lines (for diagnostics) and passes them on.
fn collect(stderr: ChildStderr) -> (mpsc::UnboundedReceiver<String>, Arc<Mutex<Vec<String>>>) {
    let (tx, lines) = mpsc::unbounded_channel();
    let log = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&log);
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            keep.lock().unwrap().push(line.clone());
            let _ = tx.send(line);
        }
    });
    (lines, log)
}

/// The text after `marker` on `line`, up to the first of `ends`.
fn after<'a>(line: &'a str, marker: &str, ends: &[char]) -> Option<&'a str> {
    let rest = line.split(marker).nth(1)?;
    Some(rest.split(ends).next().unwrap_or(rest))
}

/// The port at the end of `host:port`.
fn port_of(address: &str) -> anyhow::Result<u16> {
    address
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .with_context(|| format!("no port in {address}"))
}

/// One `mcp-id-guard` process (killed on drop) with its admin endpoints.
struct Replica {
    child: Child,
    port: u16,
    /// The admin listener's port, which HAProxy's health checks ask.
    admin_port: u16,
    admin: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    /// Starts the binary on `port` with its admin listener on `admin_port`
    /// (0: ephemeral) in front of `upstream`, and waits for its listening and
    /// admin lines.
    async fn start(
        upstream: &str,
        port: u16,
        admin_port: u16,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let mut child = Command::new(BIN)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", upstream])
            .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("MCP_ID_GUARD_UPSTREAM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("spawn mcp-id-guard")?;
        let (mut lines, log) = collect(child.stderr.take().context("stderr")?);
        let (mut listen, mut admin) = (None, None);
        let seen = tokio::time::timeout(OK_TIMEOUT, async {
            while let Some(line) = lines.recv().await {
                if let Some(address) = after(&line, "listening on http://", &[',', ' ']) {
                    listen = Some(address.to_owned());
                }
                if let Some(address) = after(&line, "admin endpoints on http://", &[' ']) {
                    admin = Some(address.to_owned());
                }
                if listen.is_some() && admin.is_some() {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        let (Some(listen), Some(admin)) = (listen, admin) else {
            bail!(
                "mcp-id-guard did not start ({seen}): {:?}",
                log.lock().unwrap()
            );
        };
        Ok(Self {
            child,
            port: port_of(&listen)?,
            admin_port: port_of(&admin)?,
            admin: format!("http://{admin}"),
            log,
        })
    }

    /// One counter or gauge from `/metrics` (0 if absent).
    async fn metric(&self, name: &str) -> anyhow::Result<u64> {
        let text = tokio::time::timeout(OK_TIMEOUT, async {
            reqwest::Client::builder()
                .no_proxy()
                .build()?
                .get(format!("{}/metrics", self.admin))
                .send()
                .await?
                .text()
                .await
        })
        .await??;
        Ok(text
            .lines()
            .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|value| value.trim().parse().ok())
            .unwrap_or(0))
    }

    /// Kills the process (SIGKILL, as a crash would) and waits for it.
    async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.start_kill()?;
        tokio::time::timeout(OK_TIMEOUT, self.child.wait()).await??;
        Ok(())
    }
}

/// Two replicas in front of one server.
async fn replicas(upstream: &str, extra: &[&str]) -> anyhow::Result<[Replica; 2]> {
    Ok([
        Replica::start(upstream, 0, 0, extra).await?,
        Replica::start(upstream, 0, 0, extra).await?,
    ])
}

/// What HAProxy balances over.
#[derive(Clone, Copy)]
struct Backends {
    /// The two replicas' ports (or the bare server's, twice).
    ports: [u16; 2],
    /// The health checks; `None` removes them from the config (the bare
    /// server has no admin listener to ask).
    checks: Option<Checks>,
}

/// Health checks against the replicas' admin listeners.
#[derive(Clone, Copy)]
struct Checks {
    admin_ports: [u16; 2],
    /// HAProxy's `inter` (written over the template's).
    interval: &'static str,
}

/// The template's default interval: checks that never time out on a
/// loaded machine, for the tests that do not take a replica down.
const DEFAULT_CHECK_INTERVAL: &str = "2s";
/// For the replica-down test: DOWN after 2 failed checks (about 0.4 s), UP
/// after 2 good ones.
const FAST_CHECK_INTERVAL: &str = "200ms";

impl Backends {
    /// The replicas, health-checked every `interval`.
    fn checked(replicas: &[Replica; 2], interval: &'static str) -> Self {
        Self {
            ports: [replicas[0].port, replicas[1].port],
            checks: Some(Checks {
                admin_ports: [replicas[0].admin_port, replicas[1].admin_port],
                interval,
            }),
        }
    }

    /// The replicas with the template's default check interval.
    fn of(replicas: &[Replica; 2]) -> Self {
        Self::checked(replicas, DEFAULT_CHECK_INTERVAL)
    }
}

/// How to derive the config from the committed template.
#[derive(Clone, Copy, PartialEq)]
enum Balancing {
    /// The template as committed: session-sticky.
    Sticky,
    /// The stick rules removed: plain round-robin (the control).
    RoundRobin,
    /// `option persist` removed: HAProxy's default moves the sessions of a
    /// DOWN replica to another one (the control of the replica-down test).
    Failover,
}

/// `haproxy -f <generated cfg> -db` on a free loopback port (killed on drop;
/// its config file removed).
struct Balancer {
    child: Child,
    config: PathBuf,
    /// `http://127.0.0.1:<port>/mcp`.
    url: String,
    /// HAProxy's stderr: its request log and its health-check verdicts.
    log: Arc<Mutex<Vec<String>>>,
}

impl Balancer {
    /// Starts HAProxy; tries another free port if the one picked was taken
    /// between picking and binding (HAProxy then exits).
    async fn start(backends: Backends, balancing: Balancing) -> anyhow::Result<Self> {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::start_on(dead_port(), backends, balancing).await {
                Ok(balancer) => return Ok(balancer),
                Err(error) => failures.push(format!("{error:#}")),
            }
        }
        bail!("haproxy did not start: {failures:#?}")
    }

    async fn start_on(port: u16, backends: Backends, balancing: Balancing) -> anyhow::Result<Self> {
        let [port1, port2] = backends.ports;
        let mut config = TEMPLATE
            .replace("${FRONTEND_PORT}", &port.to_string())
            .replace("${REPLICA1_PORT}", &port1.to_string())
            .replace("${REPLICA2_PORT}", &port2.to_string());
        match backends.checks {
            Some(checks) => {
                let [admin1, admin2] = checks.admin_ports;
                config = config
                    .replace("${REPLICA1_ADMIN_PORT}", &admin1.to_string())
                    .replace("${REPLICA2_ADMIN_PORT}", &admin2.to_string());
                let template_inter = "default-server inter 2s ";
                assert!(
                    config.contains(template_inter),
                    "no `{template_inter}` in the template"
                );
                config = config.replace(
                    template_inter,
                    &format!("default-server inter {} ", checks.interval),
                );
            }
            None => {
                for check in [
                    r#" check port "${REPLICA1_ADMIN_PORT}""#,
                    r#" check port "${REPLICA2_ADMIN_PORT}""#,
                ] {
                    assert!(config.contains(check), "no `{check}` in the template");
                    config = config.replace(check, "");
                }
            }
        }
        let dropped = match balancing {
            Balancing::Sticky => None,
            Balancing::RoundRobin => Some("stick"),
            Balancing::Failover => Some("option persist"),
        };
        if let Some(directive) = dropped {
            assert!(
                config.contains(directive),
                "no `{directive}` in the template"
            );
            config = config
                .lines()
                .filter(|line| !line.trim_start().starts_with(directive))
                .collect::<Vec<_>>()
                .join("\n");
        }
        assert!(!config.contains("${"), "unfilled placeholder:\n{config}");
        let path = std::env::temp_dir().join(format!(
            "mcp-id-guard-haproxy-{}-{port}.cfg",
            std::process::id()
        ));
        std::fs::write(&path, config + "\n")?;
        let spawned = Command::new("haproxy")
            .arg("-f")
            .arg(&path)
            .arg("-db")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => {
                let _ = std::fs::remove_file(&path);
                panic!(
                    "cannot run `haproxy` ({error}): these tests need HAProxy; install it with \
                     deploy/haproxy/install.sh (as root; .ci/run does)"
                );
            }
        };
        let (_lines, log) = collect(child.stderr.take().context("stderr")?);
        let mut balancer = Self {
            child,
            config: path,
            url: format!("http://127.0.0.1:{port}/mcp"),
            log: Arc::clone(&log),
        };
        // HAProxy says nothing when it is ready; it is once it accepts (and
        // has not exited: another process may hold the port).
        let deadline = tokio::time::Instant::now() + OK_TIMEOUT;
        loop {
            let accepts = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok();
            if let Some(status) = balancer.child.try_wait()? {
                bail!("haproxy exited ({status}): {:?}", log.lock().unwrap());
            }
            if accepts {
                return Ok(balancer);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "haproxy did not listen on {port}: {:?}",
                    log.lock().unwrap()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Balancer {
    /// How many lines HAProxy has logged so far: a mark for
    /// [`wait_for_log`](Self::wait_for_log).
    fn log_mark(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// Waits (up to `within`) until HAProxy logs a line containing `needle`
    /// after the first `mark` lines. HAProxy announces its health-check
    /// verdicts on stderr and nowhere else this config opens (no stats
    /// socket), so this polls its log.
    async fn wait_for_log(
        &self,
        mark: usize,
        needle: &str,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.log.lock().unwrap()[mark..]
                .iter()
                .any(|line| line.contains(needle))
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "haproxy did not log {needle:?} within {within:?}: {:?}",
                    &self.log.lock().unwrap()[mark..]
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

/// The session's replica: the one whose `metric` moved (exactly one must).
async fn holder<'a>(
    replicas: &'a [Replica; 2],
    metric: &str,
) -> anyhow::Result<(&'a Replica, &'a Replica)> {
    let values = [
        replicas[0].metric(metric).await?,
        replicas[1].metric(metric).await?,
    ];
    match values {
        [0, 0] => bail!("{metric} is 0 on both replicas"),
        [_, 0] => Ok((&replicas[0], &replicas[1])),
        [0, _] => Ok((&replicas[1], &replicas[0])),
        _ => bail!("{metric} moved on both replicas: {values:?} (not sticky)"),
    }
}

/// Index of the session's replica (see [`holder`]).
async fn home_index(replicas: &[Replica; 2], metric: &str) -> anyhow::Result<usize> {
    let (home, _) = holder(replicas, metric).await?;
    Ok(if std::ptr::eq(home, &replicas[0]) {
        0
    } else {
        1
    })
}

/// 12 concurrent `id: 1` calls in one session, held at the server until all
/// 12 have started (so they overlap there), then released.
async fn burst(session: &Session, rmcp: &McpServer, prefix: &str) -> anyhow::Result<Vec<Outcome>> {
    let names = sentinels(prefix);
    for sentinel in &names {
        rmcp.gates.hold(sentinel);
    }
    let calls = join_all(
        names
            .iter()
            .map(|sentinel| session.echo(json!(1), sentinel, 0, OK_TIMEOUT)),
    );
    let release = async {
        // Under a cross-wire some calls never start; release what did.
        let started = rmcp.wait_started(&names).await;
        for sentinel in &names {
            rmcp.gates.release(sentinel);
        }
        started
    };
    let (outcomes, _) = tokio::join!(calls, release);
    Ok(outcomes)
}

/// Control: the seed's burst through HAProxy straight to the bare server
/// (both "replicas" are the server itself) cross-wires.
#[tokio::test]
async fn control_burst_through_haproxy_without_the_guard_cross_wires() -> anyhow::Result<()> {
    if skip_without_haproxy("control_burst_through_haproxy_without_the_guard_cross_wires")? {
        return Ok(());
    }
    let rmcp = upstream().await?;
    let port: u16 = rmcp.base.rsplit(':').next().unwrap_or_default().parse()?;
    let backends = Backends {
        ports: [port, port],
        checks: None,
    };
    let balancer = Balancer::start(backends, Balancing::Sticky).await?;
    let session = Session::open(&balancer.url).await?;
    control_burst(&session, "HAProxy to bare rmcp").await
}

/// The seed's burst through HAProxy and two replicas: every caller gets its
/// own result, and all 12 calls went through one replica (1 passed, 11
/// remapped there; nothing on the other).
#[tokio::test]
async fn burst_through_haproxy_sticks_to_one_replica() -> anyhow::Result<()> {
    if skip_without_haproxy("burst_through_haproxy_sticks_to_one_replica")? {
        return Ok(());
    }
    let rmcp = upstream().await?;
    let replicas = replicas(&rmcp.base, &[]).await?;
    let balancer = Balancer::start(Backends::of(&replicas), Balancing::Sticky).await?;
    let session = Session::open(&balancer.url).await?;
    let outcomes = burst(&session, &rmcp, "sticky").await?;
    let tally = Tally::of(&outcomes);
    println!("burst through HAProxy (sticky, 2 replicas): {tally:?}");
    assert_eq!(tally.own, BURST, "{outcomes:?}");
    let (home, other) = holder(&replicas, "mcp_id_guard_remapped_total").await?;
    assert_eq!(home.metric("mcp_id_guard_remapped_total").await?, 11);
    assert_eq!(home.metric("mcp_id_guard_passed_total").await?, 1);
    assert_eq!(other.metric("mcp_id_guard_passed_total").await?, 0);

    // The session's DELETE reaches its replica too (rmcp then forgets it).
    let deleted = tokio::time::timeout(OK_TIMEOUT, session.delete().send()).await??;
    assert!(deleted.status().is_success(), "{}", deleted.status());
    Ok(())
}

/// Starts a held call (it stops when cancelled) with id `1` and waits until
/// it runs at the server.
async fn start_held(
    session: &Session,
    rmcp: &McpServer,
    sentinel: &str,
) -> anyhow::Result<tokio::task::JoinHandle<CallOutcome>> {
    let call = Call::held(sentinel);
    let task = tokio::spawn({
        let session = session.clone();
        async move { session.call("1", &call, OK_TIMEOUT).await.outcome }
    });
    rmcp.wait_started(&[sentinel]).await?;
    Ok(task)
}

/// Cancellation through HAProxy: `notifications/cancelled` for a held call
/// reaches the replica that forwarded the call, the server cancels it (its
/// stream ends without a response), nothing stays in flight, and the next
/// call reusing id 1 gets its own result.
#[tokio::test]
async fn cancellation_through_haproxy_reaches_the_right_replica() -> anyhow::Result<()> {
    if skip_without_haproxy("cancellation_through_haproxy_reaches_the_right_replica")? {
        return Ok(());
    }
    let rmcp = upstream().await?;
    let replicas = replicas(&rmcp.base, &[]).await?;
    let balancer = Balancer::start(Backends::of(&replicas), Balancing::Sticky).await?;
    let session = Session::open(&balancer.url).await?;
    let held = start_held(&session, &rmcp, "cancel-A").await?;

    let (_, answer) = session.cancel("1").await;
    assert_eq!(answer.status, Some(202), "{answer:?}");
    rmcp.log
        .wait_for("cancelled:cancel-A", WAIT_TIMEOUT)
        .await?;
    let outcome = tokio::time::timeout(OK_TIMEOUT, held).await??;
    assert_eq!(outcome, CallOutcome::EndedWithoutResponse);

    let (home, other) = holder(&replicas, "mcp_id_guard_cancelled_total").await?;
    assert_eq!(home.metric("mcp_id_guard_cancelled_total").await?, 1);
    assert_eq!(other.metric("mcp_id_guard_passed_total").await?, 0);
    assert_eq!(
        session.echo(json!(1), "after-cancel", 0, OK_TIMEOUT).await,
        Outcome::Own
    );
    // The cancelled id stays shadowed (--abandoned-id-ttl) in case the
    // server answers it late, so the reuse goes with a server-side id.
    assert_eq!(home.metric("mcp_id_guard_remapped_total").await?, 1);
    assert_eq!(home.metric("mcp_id_guard_in_flight_requests").await?, 0);
    Ok(())
}

/// Control (the fallback's gap): without the stick rules, two
/// `--rewrite-all-ids` replicas behind round-robin. HAProxy alternates, so
/// the call and its `notifications/cancelled` land on different replicas:
/// the other replica knows no request 1 and passes the cancellation on
/// unchanged, the server knows the call by another id, and the call is not
/// cancelled: released, it runs to completion and answers.
#[tokio::test]
async fn control_cancellation_is_lost_without_stickiness() -> anyhow::Result<()> {
    if skip_without_haproxy("control_cancellation_is_lost_without_stickiness")? {
        return Ok(());
    }
    let rmcp = upstream().await?;
    let replicas = replicas(&rmcp.base, &["--rewrite-all-ids"]).await?;
    let balancer = Balancer::start(Backends::of(&replicas), Balancing::RoundRobin).await?;
    let session = Session::open(&balancer.url).await?;
    let held = start_held(&session, &rmcp, "lost-A").await?;
    let (call_replica, _) = holder(&replicas, "mcp_id_guard_in_flight_requests").await?;

    let (_, answer) = session.cancel("1").await;
    assert_eq!(answer.status, Some(202), "{answer:?}");
    rmcp.log.wait_for("notified:1", WAIT_TIMEOUT).await?;
    assert_eq!(
        call_replica.metric("mcp_id_guard_cancelled_total").await?,
        0,
        "the cancellation reached the call's replica: round-robin did not alternate"
    );
    assert!(
        !rmcp.log.contains("cancelled:lost-A"),
        "{:?}",
        rmcp.log.snapshot()
    );
    rmcp.gates.release("lost-A");
    let outcome = tokio::time::timeout(OK_TIMEOUT, held).await??;
    println!("round-robin, cancelled call: {outcome:?}");
    assert_eq!(outcome, CallOutcome::Own, "the call ran to completion");
    assert!(!rmcp.log.contains("cancelled:lost-A"));
    Ok(())
}

/// Resumption through HAProxy: A (id 1) is held, so B (id 1) is remapped;
/// the client drops B's stream after rmcp's priming event and resumes with
/// `GET` + `Last-Event-ID`. The GET sticks to the replica that remapped B,
/// and B's answer arrives there with id 1 restored.
#[tokio::test]
async fn resumed_stream_through_haproxy_restores_the_id() -> anyhow::Result<()> {
    if skip_without_haproxy("resumed_stream_through_haproxy_restores_the_id")? {
        return Ok(());
    }
    let rmcp = upstream().await?;
    let replicas = replicas(&rmcp.base, &[]).await?;
    let balancer = Balancer::start(Backends::of(&replicas), Balancing::Sticky).await?;
    let session = Session::open(&balancer.url).await?;
    let held = start_held(&session, &rmcp, "resume-A").await?;
    let b = Call::held("resume-B");
    let event_id = session.start_echo_then_drop("1", &b).await?;
    rmcp.wait_started(&["resume-B"]).await?;

    let resumed = session.resume(&event_id, OK_TIMEOUT).await?;
    assert_eq!(resumed.status(), Some(200));
    rmcp.gates.release("resume-B");
    let get = resumed.read_response().await;
    let response = get.response.clone().context("a response on the GET")?;
    let report = crate::support::client::Report::classify("1", "resume-B", get);
    assert_eq!(report.outcome, CallOutcome::Own, "{response}");

    let (home, _) = holder(&replicas, "mcp_id_guard_restored_total").await?;
    assert_eq!(home.metric("mcp_id_guard_remapped_total").await?, 1);
    rmcp.gates.release("resume-A");
    assert_eq!(
        tokio::time::timeout(OK_TIMEOUT, held).await??,
        CallOutcome::Own
    );
    Ok(())
}

/// A restart of the session's replica mid-session: C (id 1) is held at the
/// server through that replica when it is killed (SIGKILL). The client of C
/// sees its stream cut (no response; never another call's). The replica is
/// restarted on the same port; the session's next call, reusing id 1 while C
/// still runs at the server, goes to it (sticky), is remapped by its restart
/// window and gets its own result.
#[tokio::test]
async fn replica_restart_mid_session_keeps_answers_apart() -> anyhow::Result<()> {
    if skip_without_haproxy("replica_restart_mid_session_keeps_answers_apart")? {
        return Ok(());
    }
    let rmcp = upstream().await?;
    let mut replicas = replicas(&rmcp.base, &[]).await?;
    let balancer = Balancer::start(Backends::of(&replicas), Balancing::Sticky).await?;
    let session = Session::open(&balancer.url).await?;
    let held = start_held(&session, &rmcp, "restart-C").await?;
    let index = home_index(&replicas, "mcp_id_guard_in_flight_requests").await?;

    replicas[index].kill().await?;
    let cut = tokio::time::timeout(OK_TIMEOUT, held).await??;
    println!("held call when its replica was killed: {cut:?}");
    assert!(
        matches!(
            cut,
            CallOutcome::EndedWithoutResponse | CallOutcome::Other(_)
        ),
        "{cut:?}"
    );

    let port = replicas[index].port;
    let admin_port = replicas[index].admin_port;
    replicas[index] = Replica::start(&rmcp.base, port, admin_port, &[]).await?;
    assert_eq!(
        session.echo(json!(1), "restart-D", 0, OK_TIMEOUT).await,
        Outcome::Own
    );
    let restarted = &replicas[index];
    assert_eq!(
        restarted
            .metric("mcp_id_guard_restart_remapped_total")
            .await?,
        1,
        "{:?}",
        restarted.log.lock().unwrap()
    );
    rmcp.gates.release("restart-C");
    rmcp.log
        .wait_for("finished:restart-C", WAIT_TIMEOUT)
        .await?;
    Ok(())
}

/// How long a session whose replica is down may wait for its 503: HAProxy
/// retries the refused connection 3 times, 1 s apart, then answers.
const DOWN_ANSWER_BOUND: Duration = Duration::from_secs(5);

/// A call of session A while its replica is down: `503` within
/// [`DOWN_ANSWER_BOUND`] with HAProxy's JSON-RPC error, and the server never
/// saw the call (it went to no other replica).
async fn assert_down_answer(session: &Session, rmcp: &McpServer, sentinel: &str) {
    let exchange = session
        .post(Call::echo(sentinel, 0).body("7"), OK_TIMEOUT)
        .await;
    println!(
        "session on a down replica: {:?} {:?} after {:?}: {}",
        exchange.status, exchange.content_type, exchange.elapsed, exchange.body
    );
    assert_eq!(exchange.status, Some(503), "{exchange:?}");
    assert!(
        exchange.elapsed < DOWN_ANSWER_BOUND,
        "the 503 took {:?}",
        exchange.elapsed
    );
    assert_eq!(
        exchange.content_type.as_deref(),
        Some("application/json"),
        "{exchange:?}"
    );
    let error = exchange.json();
    assert_eq!(error["jsonrpc"], "2.0", "{}", exchange.body);
    assert_eq!(error["id"], serde_json::Value::Null, "{}", exchange.body);
    assert_eq!(error["error"]["code"], -32000, "{}", exchange.body);
    assert!(error["error"]["message"].is_string(), "{}", exchange.body);
    assert!(
        !rmcp.log.contains(&format!("started:{sentinel}")),
        "the call reached the server through the other replica: {:?}",
        rmcp.log.snapshot()
    );
}

/// Session A, opened through a checked balancer, and its replica then killed.
struct Crash {
    rmcp: McpServer,
    replicas: [Replica; 2],
    balancer: Balancer,
    a: Session,
    /// Index of A's replica (the killed one).
    home: usize,
    /// HAProxy's name for it in its log (`guards/replica1` or `2`).
    home_name: String,
    /// The balancer's log before the kill.
    mark: usize,
}

/// Opens session A through HAProxy with fast health checks, checks that its
/// first call is answered (sentinel `<prefix>-A1`), then kills A's replica.
async fn crash_home_replica(balancing: Balancing, prefix: &str) -> anyhow::Result<Crash> {
    let rmcp = upstream().await?;
    let mut replicas = replicas(&rmcp.base, &[]).await?;
    let balancer =
        Balancer::start(Backends::checked(&replicas, FAST_CHECK_INTERVAL), balancing).await?;
    let a = Session::open(&balancer.url).await?;
    assert_eq!(
        a.echo(json!(1), &format!("{prefix}-A1"), 0, OK_TIMEOUT)
            .await,
        Outcome::Own
    );
    let home = home_index(&replicas, "mcp_id_guard_passed_total").await?;
    // HAProxy names the servers replica1 and replica2, in config order.
    let home_name = format!("guards/replica{}", home + 1);
    let mark = balancer.log_mark();
    replicas[home].kill().await?;
    Ok(Crash {
        rmcp,
        replicas,
        balancer,
        a,
        home,
        home_name,
        mark,
    })
}

/// A replica down, with the committed health checks (at a 200 ms interval):
/// session A lives on one replica, which is killed (SIGKILL).
/// (a) A's next call gets a 503 within 5 s whose body is a JSON-RPC error;
/// (b) once HAProxy has marked the replica DOWN, new sessions all open on the
/// other replica and their calls get their own results; (c) A's calls still
/// go nowhere else (503 again; the server never sees them, the other
/// replica's counters do not move); (d) with the replica restarted on the
/// same ports and marked UP, A's calls reach it again and are answered, and
/// new sessions are balanced over both again.
#[tokio::test]
async fn replica_down_answers_its_sessions_503_and_opens_new_ones_elsewhere() -> anyhow::Result<()>
{
    if skip_without_haproxy("replica_down_answers_its_sessions_503_and_opens_new_ones_elsewhere")? {
        return Ok(());
    }
    let Crash {
        rmcp,
        mut replicas,
        balancer,
        a,
        home,
        home_name,
        mark,
    } = crash_home_replica(Balancing::Sticky, "down").await?;
    let other = 1 - home;
    let other_passed = replicas[other].metric("mcp_id_guard_passed_total").await?;
    // (a) Right after the crash (HAProxy may not have marked it DOWN yet:
    // the connection is refused, retried and answered 503) ...
    let right_after_crash = assert_down_answer(&a, &rmcp, "down-A2");
    let once_down = async {
        balancer
            .wait_for_log(mark, &format!("{home_name} is DOWN"), WAIT_TIMEOUT)
            .await?;
        // (c) ... and once it is marked DOWN: A still sticks to it, while
        // (b) every new session opens on the other replica and works.
        let new_sessions = async {
            for i in 0..4 {
                let fresh = Session::open(&balancer.url).await?;
                let sentinel = format!("down-new{i}");
                assert_eq!(
                    fresh.echo(json!(1), &sentinel, 0, OK_TIMEOUT).await,
                    Outcome::Own
                );
            }
            anyhow::Ok(())
        };
        let (_, opened) = tokio::join!(assert_down_answer(&a, &rmcp, "down-A3"), new_sessions);
        opened
    };
    let ((), marked_down) = tokio::join!(right_after_crash, once_down);
    marked_down?;
    // The other replica passed the 4 new calls, none of A's.
    let other_passed_now = replicas[other].metric("mcp_id_guard_passed_total").await?;
    assert_eq!(other_passed_now, other_passed + 4);
    assert_eq!(
        replicas[other]
            .metric("mcp_id_guard_restart_remapped_total")
            .await?,
        0
    );

    // (d) Restarted on the same ports and marked UP: A is answered there.
    let mark = balancer.log_mark();
    let (port, admin_port) = (replicas[home].port, replicas[home].admin_port);
    replicas[home] = Replica::start(&rmcp.base, port, admin_port, &[]).await?;
    balancer
        .wait_for_log(mark, &format!("{home_name} is UP"), WAIT_TIMEOUT)
        .await?;
    assert_eq!(
        a.echo(json!(1), "down-A4", 0, OK_TIMEOUT).await,
        Outcome::Own
    );
    // The new process did not see A's `initialize`: within its restart
    // window it gives A's calls server-side ids.
    assert_eq!(
        replicas[home]
            .metric("mcp_id_guard_restart_remapped_total")
            .await?,
        1
    );
    assert_eq!(
        replicas[other].metric("mcp_id_guard_passed_total").await?,
        other_passed_now
    );
    // Balanced over both again: of three new sessions, at least one opens
    // on it (round-robin's order across a server's return is HAProxy's).
    for i in 0..3 {
        let fresh = Session::open(&balancer.url).await?;
        let sentinel = format!("up-new{i}");
        assert_eq!(
            fresh.echo(json!(1), &sentinel, 0, OK_TIMEOUT).await,
            Outcome::Own
        );
    }
    let passed_home = replicas[home].metric("mcp_id_guard_passed_total").await?;
    assert!(passed_home >= 1, "no new session on the restarted replica");
    Ok(())
}

/// Control (why `option persist`): the same crash with the persistence line
/// removed. Once HAProxy has marked the replica DOWN it ignores the stick
/// entry naming it and balances session A's call to the other replica, which
/// answers it (200) although it never saw the session begin: the failover
/// that README.md rules out.
#[tokio::test]
async fn control_without_persist_a_down_replicas_session_moves() -> anyhow::Result<()> {
    if skip_without_haproxy("control_without_persist_a_down_replicas_session_moves")? {
        return Ok(());
    }
    let Crash {
        rmcp,
        replicas,
        balancer,
        a,
        home,
        home_name,
        mark,
    } = crash_home_replica(Balancing::Failover, "moved").await?;
    let other = 1 - home;
    balancer
        .wait_for_log(mark, &format!("{home_name} is DOWN"), WAIT_TIMEOUT)
        .await?;
    let moved = a.echo(json!(1), "moved-A2", 0, OK_TIMEOUT).await;
    println!("without option persist, A's call after its replica is DOWN: {moved:?}");
    assert_eq!(moved, Outcome::Own);
    assert!(rmcp.log.contains("started:moved-A2"));
    // The other replica took it as a session it did not see begin: only
    // because it started moments ago (its --restart-window) does it give the
    // call a server-side id; past that window it would pass a reused id
    // straight on.
    assert_eq!(
        replicas[other]
            .metric("mcp_id_guard_restart_remapped_total")
            .await?,
        1
    );
    Ok(())
}
