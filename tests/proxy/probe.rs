//! `mcp-id-guard probe`, run as a process against the rmcp 3.11 echo server:
//! bare (the control: it finds the bug), behind the guard (clean), behind a
//! guard that rejects duplicates (refused, which is safe), and against a
//! port that refuses connections (could not probe). The probe's `--json`
//! report is read back; every run is bounded.

use std::time::Duration;

use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use serde_json::Value;
use tokio::process::Command;

use crate::support::process::BIN;
use crate::support::server::{refused_port, serve};

/// Bound of one probe run: two checks whose pairs may each hang for the
/// probe's own timeout, twice (two waves), and the sessions around them.
const PROBE_RUN: Duration = Duration::from_secs(60);

/// Runs `mcp-id-guard probe URL --json` with a short timeout; its exit code
/// and report.
async fn probe(url: &str, flags: &[&str]) -> anyhow::Result<(Option<i32>, Value)> {
    let output = tokio::time::timeout(
        PROBE_RUN,
        Command::new(BIN)
            .args(["probe", url, "--json", "--timeout", "2s"])
            .args(flags)
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("probe {url} {flags:?}: {}\n{stdout}", output.status);
    let report = serde_json::from_str(&stdout)
        .map_err(|error| anyhow::anyhow!("no JSON report ({error}): {stdout}"))?;
    Ok((output.status.code(), report))
}

/// The check named `name` of a report.
fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|check| check["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The control: rmcp answers requests that share an id in one session with
/// each other's answers, or not at all. The probe says so and exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_finds_the_bug_in_a_bare_server() -> anyhow::Result<()> {
    let server = serve(None).await?;
    let (code, report) = probe(server.url(), &[]).await?;
    let same_id = check(&report, "same-id");
    assert_eq!(same_id["verdict"], "bug", "{same_id:#}");
    let counts = &same_id["counts"];
    let failed = ["swapped", "wrong_id", "hung", "lost"]
        .iter()
        .map(|kind| counts[kind].as_u64().unwrap_or_default())
        .sum::<u64>();
    assert!(failed > 0, "{counts}");
    assert_eq!(report["verdict"], "bug");
    assert_eq!(code, Some(1));
    Ok(())
}

/// The same server behind the guard: every request gets its own answer; the
/// probe exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_finds_nothing_behind_the_guard() -> anyhow::Result<()> {
    let server = serve(Some(IdGuardLayer::new())).await?;
    let (code, report) = probe(server.url(), &[]).await?;
    for name in ["same-id", "number-vs-string"] {
        let found = check(&report, name);
        assert_eq!(found["verdict"], "ok", "{found:#}");
        assert_eq!(found["counts"]["own"], 40, "{found:#}");
    }
    assert_eq!(check(&report, "reuse-after-abandon")["verdict"], "skipped");
    assert_eq!(code, Some(0), "{report:#}");
    Ok(())
}

/// A server that refuses duplicates (the guard under `OnDuplicate::Reject`,
/// as go-sdk does): refused with 400 and -32600, which is safe; exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_reports_refused_duplicates_as_safe() -> anyhow::Result<()> {
    let guard = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(guard)).await?;
    let (code, report) = probe(server.url(), &[]).await?;
    let same_id = check(&report, "same-id");
    assert_eq!(same_id["verdict"], "ok-refused", "{same_id:#}");
    let refusals = same_id["refusals"].as_array().cloned().unwrap_or_default();
    assert!(!refusals.is_empty(), "{same_id:#}");
    for refusal in &refusals {
        assert_eq!(
            (&refusal["status"], &refusal["code"]),
            (&400.into(), &(-32600).into())
        );
    }
    assert_eq!(code, Some(0), "{report:#}");
    Ok(())
}

/// Nothing listens: the probe could not probe, exit 2.
#[tokio::test]
async fn probe_of_an_unreachable_server_exits_2() -> anyhow::Result<()> {
    let port = refused_port();
    let (code, report) = probe(&format!("http://127.0.0.1:{}/mcp", port.port), &[]).await?;
    assert!(report["error"].as_str().is_some(), "{report:#}");
    assert_eq!(code, Some(2));
    Ok(())
}

/// The flags of reuse-after-abandon: the echo tool, working 400 ms a call.
const SLOW_ECHO: [&str; 4] = [
    "--tool",
    "echo",
    "--args",
    r#"{"sentinel": "probe", "delay_ms": 400}"#,
];

/// With a tool that takes a while, reuse-after-abandon runs: behind the
/// guard, pings reusing the id of an abandoned (or cancelled) call get their
/// own answers. No control here: bare rmcp 3.11 passes this check too (its
/// late answer finds no stream); the packaging test's bare python-sdk server
/// is the one that fails it, some of the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_reuses_the_id_of_an_abandoned_call() -> anyhow::Result<()> {
    let server = serve(Some(IdGuardLayer::new())).await?;
    let (code, report) = probe(server.url(), &SLOW_ECHO).await?;
    let reuse = check(&report, "reuse-after-abandon");
    assert_eq!(reuse["verdict"], "ok", "{reuse:#}");
    assert!(reuse["counts"]["own"].as_u64() >= Some(2), "{reuse:#}");
    assert_eq!(code, Some(0), "{report:#}");
    Ok(())
}

/// `--help` points to the probe; `probe --help` lists its flags, and the
/// proxy's own command line still works without the subcommand.
#[tokio::test]
async fn help_shows_the_probe() -> anyhow::Result<()> {
    let help = |args: &'static [&'static str]| async move {
        let output =
            tokio::time::timeout(PROBE_RUN, Command::new(BIN).args(args).output()).await??;
        anyhow::ensure!(output.status.success(), "{args:?}: {}", output.status);
        anyhow::Ok(String::from_utf8(output.stdout)?)
    };
    let proxy = help(&["--help"]).await?;
    assert!(proxy.contains("mcp-id-guard probe URL"), "{proxy}");
    assert!(proxy.contains("--upstream"), "{proxy}");
    let probe = help(&["probe", "--help"]).await?;
    for expected in [
        "<URL>",
        "--json",
        "--pairs",
        "--concurrency",
        "--timeout",
        "--header",
        "--tool",
        "--args",
        "--strict",
    ] {
        assert!(
            probe.contains(expected),
            "{expected} missing from:\n{probe}"
        );
    }
    Ok(())
}
