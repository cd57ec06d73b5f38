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

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::{
    burst, drained_stats, pair, serve, CallReport, Client, EchoCall, Tally, TestServer,
    HANG_TIMEOUT, OK_TIMEOUT, WAIT_TIMEOUT,
};
use mcp_id_guard::{IdGuardLayer, OnDuplicate};

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
    reports: Vec<CallReport>,
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
            let stats = drained_stats(layer, WAIT_TIMEOUT).await;
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
    server.stop().await;
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
async fn queued_pair(
    server: &TestServer,
    client: &Client,
    tag: &str,
) -> anyhow::Result<Vec<CallReport>> {
    let a = EchoCall::held(format!("{tag}-A"));
    let b = EchoCall::held(format!("{tag}-B"));
    let task_a = tokio::spawn({
        let (client, a) = (client.clone(), a.clone());
        async move { client.call_echo("1", &a, OK_TIMEOUT).await }
    });
    server.started.wait_for(&a.sentinel, WAIT_TIMEOUT).await?;
    let task_b = tokio::spawn({
        let (client, b) = (client.clone(), b.clone());
        async move { client.call_echo("1", &b, OK_TIMEOUT).await }
    });
    server.gates.release(&b.sentinel);
    server.gates.release(&a.sentinel);
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
            if let common::Outcome::Other(detail) = &report.outcome {
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
