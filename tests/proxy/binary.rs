//! The `mcp-id-guard` binary, spawned as a process in front of an rmcp 3.11
//! server: `--help`, an MCP exchange through it, its flags and env vars, and
//! graceful shutdown on SIGTERM. Every wait is bounded; the process is killed
//! when a test ends early.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::process::Command;

use crate::support::client::Session;
use crate::support::process::{Guard, BIN};
use crate::support::proxy::{duplicate_while_held, Outcome};
use crate::support::server::upstream;
use crate::support::OK_TIMEOUT;

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
        "--upstream-port",
        "--upstream-start-timeout",
        "PORT=",
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
    let guard = Guard::start_env(
        &["--on-duplicate", "reject", "--reject-status", "409"],
        &[("MCP_ID_GUARD_UPSTREAM", &rmcp.base)],
    )
    .await?;
    let session = Session::open(&format!("{}/mcp", guard.base)).await?;
    assert_eq!(
        session.echo(json!(1), "hello", 0, OK_TIMEOUT).await,
        Outcome::Own
    );

    assert_eq!(
        duplicate_while_held(&rmcp, &session).await?,
        Outcome::Rejected {
            status: 409,
            id: json!(1),
            code: -32600
        }
    );
    Ok(())
}

/// SIGTERM while a tool call is in flight: the binary stops accepting, lets
/// the call finish (its client gets the result), and exits 0 well before
/// the grace period is over.
#[tokio::test]
async fn sigterm_lets_in_flight_calls_finish_and_exits_0() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let mut guard =
        Guard::start_env(&["--upstream", &rmcp.base, "--grace-period", "20s"], &[]).await?;
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
    let mut guard =
        Guard::start_env(&["--upstream", &rmcp.base, "--grace-period", "1s"], &[]).await?;
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
