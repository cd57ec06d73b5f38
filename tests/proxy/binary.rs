//! The `mcp-id-guard` binary, spawned as a process in front of an rmcp 3.11
//! server: `--help`, an MCP exchange through it, its flags and env vars, and
//! graceful shutdown on SIGTERM. Every wait is bounded; the process is killed
//! when a test ends early.
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::support::client::Session;
use crate::support::proxy::Outcome;
use crate::support::server::upstream;
use crate::support::OK_TIMEOUT;

const BIN: &str = env!("CARGO_BIN_EXE_mcp-id-guard");

/// A running `mcp-id-guard` process (killed on drop) and its log lines.
struct Guard {
    child: Child,
    /// `http://127.0.0.1:<port>`, read from the startup line.
    base: String,
    lines: mpsc::UnboundedReceiver<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Guard {
    /// Starts the binary on an ephemeral port with `args` (and `env`), and
    /// waits for its startup line.
    async fn start(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut command = Command::new(BIN);
        command
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("MCP_ID_GUARD_UPSTREAM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().context("spawn mcp-id-guard")?;
        let stderr = child.stderr.take().context("stderr")?;
        let (tx, mut lines) = mpsc::unbounded_channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&log);
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                keep.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let startup = tokio::time::timeout(OK_TIMEOUT, async {
            while let Some(line) = lines.recv().await {
                if line.contains("listening on") {
                    return Some(line);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .with_context(|| format!("no startup line; log: {:?}", log.lock().unwrap()))?;
        println!("startup line: {startup}");
        let base = startup
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .context("no address on the startup line")?
            .to_owned();
        Ok(Self {
            child,
            base,
            lines,
            log,
        })
    }

    /// Waits (bounded) for a log line containing `text`.
    async fn wait_for_line(&mut self, text: &str) -> anyhow::Result<String> {
        let found = tokio::time::timeout(OK_TIMEOUT, async {
            while let Some(line) = self.lines.recv().await {
                if line.contains(text) {
                    return Some(line);
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        found.with_context(|| format!("no {text:?} in {:?}", self.log.lock().unwrap()))
    }

    fn sigterm(&self) -> anyhow::Result<()> {
        let pid = self.child.id().context("already exited")?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM {pid}: {status}");
        Ok(())
    }

    async fn wait_exit(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => bail!(
                "still running after {within:?}; log: {:?}",
                self.log.lock().unwrap()
            ),
        }
    }
}

#[tokio::test]
async fn help_lists_every_option() -> anyhow::Result<()> {
    let output =
        tokio::time::timeout(OK_TIMEOUT, Command::new(BIN).arg("--help").output()).await??;
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout)?;
    for expected in [
        "--listen",
        "--upstream",
        "--on-duplicate",
        "remap",
        "reject",
        "--reject-status",
        "--max-body-bytes",
        "--max-in-flight-per-session",
        "--connect-timeout",
        "--grace-period",
        "queue",
        "--max-queue-wait",
        "--rewrite-all-ids",
        "MCP_ID_GUARD_UPSTREAM",
        "MCP_ID_GUARD_LISTEN",
    ] {
        assert!(help.contains(expected), "{expected} missing from:\n{help}");
    }
    Ok(())
}

#[tokio::test]
async fn invalid_upstream_exits_with_an_error() -> anyhow::Result<()> {
    let output = tokio::time::timeout(
        OK_TIMEOUT,
        Command::new(BIN)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "https://example.com/mcp",
            ])
            .output(),
    )
    .await??;
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        stderr.contains("https upstreams are not supported"),
        "{stderr}"
    );
    Ok(())
}

/// An MCP exchange through the binary (upstream from the environment), with
/// the reject policy and status from the flags: a duplicate of a held call
/// gets 409, the held call its own result.
#[tokio::test]
async fn mcp_exchange_through_the_binary() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = Guard::start(
        &["--on-duplicate", "reject", "--reject-status", "409"],
        &[("MCP_ID_GUARD_UPSTREAM", &rmcp.base)],
    )
    .await?;
    let session = Session::open(&format!("{}/mcp", guard.base)).await?;
    assert_eq!(
        session.echo(json!(1), "hello", 0, OK_TIMEOUT).await,
        Outcome::Own
    );

    rmcp.gates.hold("A");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "A", 0, OK_TIMEOUT).await }
    });
    rmcp.wait_started(&["A"]).await?;
    assert_eq!(
        session.echo(json!(1), "B", 0, OK_TIMEOUT).await,
        Outcome::Rejected {
            status: 409,
            id: json!(1),
            code: -32600
        }
    );
    rmcp.gates.release("A");
    assert_eq!(a.await?, Outcome::Own);
    Ok(())
}

/// SIGTERM while a tool call is in flight: the binary stops accepting, lets
/// the call finish (its client gets the result), and exits 0 well before
/// the grace period is over.
#[tokio::test]
async fn sigterm_lets_in_flight_calls_finish_and_exits_0() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let mut guard = Guard::start(&["--upstream", &rmcp.base, "--grace-period", "20s"], &[]).await?;
    let session = Session::open(&format!("{}/mcp", guard.base)).await?;
    rmcp.gates.hold("A");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "A", 0, OK_TIMEOUT).await }
    });
    rmcp.wait_started(&["A"]).await?;

    let signalled = Instant::now();
    guard.sigterm()?;
    guard.wait_for_line("SIGTERM received").await?;
    rmcp.gates.release("A");
    assert_eq!(a.await?, Outcome::Own);
    let status = guard.wait_exit(OK_TIMEOUT).await?;
    let elapsed = signalled.elapsed();
    println!("exited {status} {elapsed:?} after SIGTERM (in-flight call finished)");
    assert!(status.success(), "{status}");
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    Ok(())
}

/// SIGTERM while an SSE stream stays open: after the grace period (1 s) the
/// stream is cut, the client's stream ends, and the binary exits 0.
#[tokio::test]
async fn sigterm_cuts_open_streams_after_the_grace_period() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let grace = Duration::from_secs(1);
    let mut guard = Guard::start(&["--upstream", &rmcp.base, "--grace-period", "1s"], &[]).await?;
    let session = Session::open(&format!("{}/mcp", guard.base)).await?;
    let mut stream = tokio::time::timeout(OK_TIMEOUT, session.get_stream().send()).await??;
    assert_eq!(stream.status(), 200);

    let signalled = Instant::now();
    guard.sigterm()?;
    let status = guard.wait_exit(grace + OK_TIMEOUT).await?;
    let elapsed = signalled.elapsed();
    println!("exited {status} {elapsed:?} after SIGTERM (grace period {grace:?}, one open stream)");
    assert!(status.success(), "{status}");
    assert!(
        elapsed >= grace,
        "the open stream was cut early: {elapsed:?}"
    );
    guard.wait_for_line("grace period").await?;
    let ended = tokio::time::timeout(OK_TIMEOUT, async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the client's stream did not end");
    Ok(())
}
