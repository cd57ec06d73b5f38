//! `mcp-id-guard probe URL`: checks an MCP streamable-HTTP server, bare or
//! behind the guard, for the duplicate-id cross-wiring bug, and prints a
//! verdict per check (exit code 0: nothing found, 1: a bug, 2: could not
//! probe).
//!
//! Safe to point at a production server: by default it sends only
//! `initialize`, `notifications/initialized`, `ping`, `tools/list`,
//! `notifications/cancelled`, `GET`s resuming its own streams and a DELETE
//! of its own sessions; a tool only when the operator names one. Requests,
//! connections and every wait are bounded by the flags, the whole run by
//! [`RUN_TIMEOUTS`] times `--timeout`, and memory by reading answers as they
//! stream (`scan`, `events`).
//!
//! Safe to point at a hostile server too: what it sends reaches the
//! terminal escaped (`report`), and an answer of any size costs a few
//! hundred bytes.

mod abandon;
mod client;
mod events;
mod hosts;
mod judge;
mod pairs;
mod report;
mod scan;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use http::header::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use client::{Client, Endpoint, Reply, SESSION_ID};
use judge::Shape;
use pairs::PairIds;
use report::{Check, Report, Verdict};

/// The protocol revision the probe asks for; the server's choice is used.
const PROTOCOL_VERSION: &str = "2025-06-18";

/// The whole run's limit, in `--timeout`s: a server that hangs on every
/// request is done with in this time (each check stops at its first wave
/// with hung requests), not in one timeout per request wave and session.
/// The reuse-after-abandon check adds what its tool's calls need.
const RUN_TIMEOUTS: u32 = 4;

/// The command line of `mcp-id-guard probe`, parsed on its own so that the
/// proxy's command line stays as it is.
#[derive(Debug, Parser)]
#[command(name = "mcp-id-guard", version)]
struct CommandLine {
    #[command(subcommand)]
    command: ProbeCommand,
}

#[derive(Debug, Subcommand)]
enum ProbeCommand {
    Probe(ProbeArgs),
}

/// Checks an MCP streamable-HTTP server (bare, or behind mcp-id-guard) for
/// the duplicate-id bug: concurrent requests that share a JSON-RPC id in one
/// session getting each other's answers, or none.
///
/// Checks: same-id (pairs of concurrent ping and tools/list with one id),
/// number-vs-string (ids 7 and "7" at once), reuse-after-abandon (a ping
/// reusing the id of an abandoned or cancelled tool call; only with --tool),
/// host and origin (a rebound Host, a foreign Origin: refused or accepted).
///
/// Sends only initialize, notifications/initialized, ping, tools/list,
/// notifications/cancelled and a DELETE of its own sessions, unless --tool
/// names a tool to call. Exit code: 0 no problem found, 1 a bug found (or a
/// warning, with --strict), 2 could not probe.
#[derive(Debug, clap::Args)]
pub(crate) struct ProbeArgs {
    /// The MCP endpoint, such as http://127.0.0.1:8000/mcp (http only).
    url: String,

    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,

    /// Pairs of concurrent same-id requests per check (1-200).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=200))]
    pairs: u16,

    /// Pairs in flight at once (two connections each; 1-50).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=50))]
    concurrency: u16,

    /// How long to wait for each connection and each answer (e.g. 5s,
    /// 500ms); a request unanswered by then counts as hung. The whole probe
    /// ends within 4 times this (plus the tool's calls with --tool): checks
    /// it had no time for are reported as errors.
    #[arg(long, default_value = "5s", value_parser = crate::args::parse_duration)]
    timeout: Duration,

    /// A header for every request, such as 'Authorization: Bearer ...'
    /// (repeatable). Values are never printed.
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE", value_parser = parse_header)]
    headers: Vec<(HeaderName, HeaderValue)>,

    /// A tool to call for reuse-after-abandon: pick one without side effects
    /// whose call takes a while (at least 100 ms). Called 3 times.
    #[arg(long, value_name = "NAME")]
    tool: Option<String>,

    /// The tool's arguments, a JSON object (default {}).
    #[arg(long = "args", value_name = "JSON", requires = "tool", value_parser = parse_object)]
    arguments: Option<Value>,

    /// Exit 1 on warnings (an accepted foreign Host or Origin) too.
    #[arg(long)]
    strict: bool,
}

/// Whether the command line asks for the probe (`mcp-id-guard probe ...`).
/// The proxy takes no positional arguments, so this word cannot be
/// anything else.
pub(crate) fn requested() -> bool {
    std::env::args_os().nth(1).is_some_and(|arg| arg == "probe")
}

/// Parses the probe's command line, runs it, prints the report.
pub(crate) fn main() -> ExitCode {
    let ProbeCommand::Probe(args) = CommandLine::parse().command;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("could not start the Tokio runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let json = args.json;
    let report = runtime.block_on(run(args));
    // Connections of hung requests are cut here.
    runtime.shutdown_timeout(Duration::from_millis(100));
    if json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    ExitCode::from(report.exit_code)
}

/// What a server's answers to `ping` and `tools/list` look like.
#[derive(Debug, Clone)]
struct Shapes {
    ping: Shape,
    tools: Shape,
}

/// A session the probe opened.
struct Opened {
    client: Client,
    server: Option<Value>,
    protocol: Option<String>,
}

/// `initialize` and `notifications/initialized`: a session of the probe's
/// own, in the protocol revision the server chose.
async fn open_session(base: &Client) -> Result<Opened, String> {
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "mcp-id-guard-probe", "version": env!("CARGO_PKG_VERSION")},
    }});
    let mut connection = base.connect().await?;
    let (reply, session) = base
        .send(&mut connection, base.post(&initialize, &[]))
        .await;
    let answer = match reply {
        Reply::Answer { answer, .. } if !matches!(answer.shape, Shape::Error(_)) => answer,
        other => return Err(format!("initialize failed: {other:?}")),
    };
    let protocol = answer.protocol_version;
    let header = protocol
        .as_deref()
        .and_then(|p| HeaderValue::from_str(p).ok());
    let client = base.in_session(session, header);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    match client.call(&initialized, &[]).await {
        Reply::Status { status, .. } | Reply::Answer { status, .. } if status < 300 => {}
        other => return Err(format!("notifications/initialized failed: {other:?}")),
    }
    Ok(Opened {
        client,
        server: answer.server,
        protocol,
    })
}

/// Runs every check, each in a session of its own.
async fn run(args: ProbeArgs) -> Report {
    let mut report = Report {
        url: args.url.clone(),
        server: None,
        protocol_version: None,
        session: false,
        headers: args
            .headers
            .iter()
            .map(|(name, _)| name.to_string())
            .collect(),
        checks: Vec::new(),
        error: None,
        verdict: Verdict::Ok,
        exit_code: 0,
    };
    if let Err(error) = probe(&args, &mut report).await {
        report.error = Some(error);
    }
    report.decide(args.strict);
    report
}

async fn probe(args: &ProbeArgs, report: &mut Report) -> Result<(), String> {
    let base = Client::new(
        Endpoint::parse(&args.url)?,
        args.headers.clone(),
        args.timeout,
        args.timeout * RUN_TIMEOUTS,
    );
    let first = open_session(&base).await?;
    report.server = first.server.clone();
    report.protocol_version = first.protocol.clone();
    report.session = first.client.has_session();
    let shapes = pairs::learn(&first.client).await;
    first.client.end_session().await;
    let shapes = shapes?;
    let (pairs, concurrency) = (usize::from(args.pairs), usize::from(args.concurrency));

    let shapes = &shapes;
    for ids in [PairIds::Same, PairIds::NumberAndString] {
        if base.out_of_time() {
            report.checks.push(not_run(ids.name()));
            continue;
        }
        let check = in_session(&base, ids.name(), |client| async move {
            pairs::check(&client, shapes, pairs, concurrency, ids).await
        });
        report.checks.push(check.await);
    }
    let empty = json!({});
    let tool = args
        .tool
        .as_deref()
        .map(|tool| (tool, args.arguments.as_ref().unwrap_or(&empty)));
    report.checks.push(if base.out_of_time() {
        not_run(abandon::NAME)
    } else {
        abandon::check(&base, shapes, tool).await
    });
    if base.out_of_time() {
        report.checks.extend(["host", "origin"].map(not_run));
        return Ok(());
    }
    match open_session(&base).await {
        Ok(session) => {
            report
                .checks
                .extend(hosts::checks(&session.client, shapes).await);
            session.client.end_session().await;
        }
        Err(error) => {
            for name in ["host", "origin"] {
                report
                    .checks
                    .push(Check::plain(name, Verdict::Error, error.clone()));
            }
        }
    }
    Ok(())
}

/// A check the run limit left no time for.
fn not_run(name: &'static str) -> Check {
    Check::plain(
        name,
        Verdict::Error,
        format!("not run: the probe ran out of time ({RUN_TIMEOUTS} x --timeout)"),
    )
}

/// Runs one check in a fresh session, then ends the session.
async fn in_session<F, R>(base: &Client, name: &'static str, check: F) -> Check
where
    F: FnOnce(Client) -> R,
    R: std::future::Future<Output = Check>,
{
    match open_session(base).await {
        Ok(session) => {
            let client = session.client;
            let result = check(client.clone()).await;
            client.end_session().await;
            result
        }
        Err(error) => Check::plain(name, Verdict::Error, error),
    }
}

/// `Name: value`; the value is marked sensitive and never shown.
fn parse_header(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| "give a header as 'Name: value'".to_owned())?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{:?} is not a header name", name.trim()))?;
    let mut value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of {name} is not a valid header value"))?;
    value.set_sensitive(true);
    if name.as_str() == SESSION_ID {
        return Err(format!(
            "{SESSION_ID} is the probe's own (it opens its own sessions)"
        ));
    }
    Ok((name, value))
}

/// A JSON object.
fn parse_object(text: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err("the tool's arguments must be a JSON object, such as {\"x\": 1}".to_owned()),
        Err(error) => Err(format!("not JSON: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_their_values_to_themselves() {
        let (name, value) = parse_header("Authorization: Bearer secret-token").unwrap();
        assert_eq!(name, "authorization");
        assert!(value.is_sensitive());
        assert_eq!(value, "Bearer secret-token");
        let error = parse_header("Authorization: bad\u{7f}secret").unwrap_err();
        assert!(!error.contains("secret"), "{error}");
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("Mcp-Session-Id: x").is_err());
    }

    #[test]
    fn command_line() {
        let ProbeCommand::Probe(args) =
            CommandLine::try_parse_from(["mcp-id-guard", "probe", "http://127.0.0.1:1/mcp"])
                .unwrap()
                .command;
        assert_eq!((args.pairs, args.concurrency), (20, 10));
        assert_eq!(args.timeout, Duration::from_secs(5));
        assert!(CommandLine::try_parse_from(["x", "probe", "u", "--pairs", "201"]).is_err());
        assert!(CommandLine::try_parse_from(["x", "probe", "u", "--args", "{}"]).is_err());
        assert!(
            CommandLine::try_parse_from(["x", "probe", "u", "--tool", "t", "--args", "[]"])
                .is_err()
        );
    }
}
