//! `mcp-id-guard probe` against small hand-made servers on loopback that a
//! careless probe misjudges or that attack the probe itself (issue 30,
//! items 4 and 5): a server whose `serverInfo` carries terminal escapes,
//! spec-valid servers that close POST streams for polling (SEP-1699) or end
//! SSE lines with CR alone, one that answers duplicates with HTTP 500, one
//! that hangs on everything after the first answers, and one whose answers
//! are 8 MiB each.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::sync::Notify;

use crate::support::process::BIN;
use crate::support::server::{serve_service, Served};

/// Bound of one probe run.
const PROBE_RUN: Duration = Duration::from_secs(60);

/// What the server does wrong (or unusually, but within the spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `serverInfo` draws on the terminal: clears it, sets the title, and
    /// writes a fake verdict in green.
    Ansi,
    /// SEP-1699: every POST stream gets a priming event (an id and a
    /// `retry`) and is closed; the answer waits for `GET` + `Last-Event-ID`.
    Polling,
    /// SSE answers whose lines end with CR alone.
    CrOnly,
    /// A request whose id (as text) is already in flight gets HTTP 500.
    FiveHundred,
    /// Answers `initialize` and the first `ping` and `tools/list`; every
    /// later request (and DELETE) hangs.
    Hanging,
    /// Every answer carries 8 MiB less 4 KiB of padding before its id:
    /// `ping` as JSON, `tools/list` as SSE.
    Huge,
}

/// What the terminal would do with [`Kind::Ansi`]'s name.
const HOSTILE_NAME: &str = "\u{1b}[2J\u{1b}[H\u{1b}]0;pwned\u{7}\u{1b}[32mverdict: OK (exit 0)\u{1b}[0m\u{9b}31m\u{202e}evil";

/// The padding of [`Kind::Huge`]'s answers.
const PAD_BYTES: usize = 8 * 1024 * 1024 - 4 * 1024;

type Body = BoxBody<Bytes, Infallible>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// The state one hostile server keeps.
struct State {
    kind: Kind,
    /// Polling: answers waiting for their `GET`, by event id.
    pending: Mutex<HashMap<String, Value>>,
    events: AtomicU64,
    /// FiveHundred: ids in flight (as text), each with what wakes it.
    in_flight: Mutex<HashMap<String, Arc<Notify>>>,
    pad: Bytes,
}

async fn answer(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|body| body.to_bytes())
        .unwrap_or_default();
    let kind = state.kind;
    let sse = |text: String| {
        let mut response = Response::new(full(text));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        response
    };
    if parts.method == Method::DELETE {
        if kind == Kind::Hanging {
            std::future::pending::<()>().await;
        }
        return Response::new(full(""));
    }
    if parts.method == Method::GET {
        let pending = parts
            .headers
            .get("last-event-id")
            .and_then(|id| id.to_str().ok())
            .and_then(|id| state.pending.lock().unwrap().remove(id));
        return match pending {
            Some(message) if kind == Kind::Polling => {
                sse(format!("id: answered\ndata: {message}\n\n"))
            }
            _ => {
                let mut response = Response::new(full(""));
                *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
                response
            }
        };
    }
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        let mut response = Response::new(full("bad json"));
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    };
    let id = message["id"].clone();
    let method = message["method"].as_str().unwrap_or_default().to_owned();
    if id.is_null() {
        let mut response = Response::new(full(""));
        *response.status_mut() = StatusCode::ACCEPTED;
        return response;
    }
    if method == "initialize" {
        let name = if kind == Kind::Ansi {
            HOSTILE_NAME
        } else {
            "hostile"
        };
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": name, "version": "1\u{1b}[5m"},
        }});
        let mut response = Response::new(full(answer.to_string()));
        response.headers_mut().insert(
            "mcp-session-id",
            HeaderValue::from_static("hostile-session"),
        );
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return response;
    }
    let result = if method == "tools/list" {
        json!({"tools": []})
    } else {
        json!({})
    };
    let reply = json!({"jsonrpc": "2.0", "id": id, "result": result});
    match kind {
        Kind::Ansi => Response::new(full(reply.to_string())),
        Kind::Polling => {
            let event = format!("e{}", state.events.fetch_add(1, Ordering::Relaxed));
            state.pending.lock().unwrap().insert(event.clone(), reply);
            sse(format!("id: {event}\nretry: 10\ndata:\n\n"))
        }
        Kind::CrOnly => sse(format!(
            ": hello\r\revent: message\rid: 1\rdata: {reply}\r\r"
        )),
        Kind::FiveHundred => {
            let key = match &id {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let waiting = {
                let mut in_flight = state.in_flight.lock().unwrap();
                match in_flight.get(&key) {
                    Some(first) => {
                        first.notify_one();
                        None
                    }
                    None => {
                        let notify = Arc::new(Notify::new());
                        in_flight.insert(key.clone(), Arc::clone(&notify));
                        Some(notify)
                    }
                }
            };
            let Some(notify) = waiting else {
                let mut response = Response::new(full("Internal Server Error"));
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return response;
            };
            // Held until its duplicate arrives (the probe sends pairs at
            // once), or briefly when it has none.
            let _ = tokio::time::timeout(Duration::from_millis(300), notify.notified()).await;
            state.in_flight.lock().unwrap().remove(&key);
            Response::new(full(reply.to_string()))
        }
        Kind::Hanging => {
            if id == json!(1) || id == json!(2) {
                return Response::new(full(reply.to_string()));
            }
            std::future::pending::<()>().await;
            unreachable!()
        }
        Kind::Huge => {
            let sse = method == "tools/list";
            let head = if sse {
                r#"data: {"jsonrpc":"2.0","result":{"tools":[],"pad":""#.to_owned()
            } else {
                r#"{"jsonrpc":"2.0","result":{"pad":""#.to_owned()
            };
            let tail = if sse {
                format!("\"}},\"id\":{id}}}\n\n")
            } else {
                format!("\"}},\"id\":{id}}}")
            };
            let frames = [Bytes::from(head), state.pad.clone(), Bytes::from(tail)]
                .into_iter()
                .map(|bytes| Ok::<_, Infallible>(Frame::data(bytes)));
            let mut response =
                Response::new(StreamBody::new(futures::stream::iter(frames)).boxed());
            let content_type = if sse {
                "text/event-stream"
            } else {
                "application/json"
            };
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(content_type),
            );
            response
        }
    }
}

/// A hostile server of `kind` on loopback; its MCP endpoint is `/mcp`.
async fn hostile(kind: Kind) -> anyhow::Result<(Served, String)> {
    let state = Arc::new(State {
        kind,
        pending: Mutex::default(),
        events: AtomicU64::new(0),
        in_flight: Mutex::default(),
        pad: Bytes::from(vec![b'x'; PAD_BYTES]),
    });
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(answer(state, request).await) }
    });
    let served = serve_service(service).await?;
    let url = format!("http://{}/mcp", served.addr);
    Ok((served, url))
}

/// One probe run: exit code, stdout, how long it took and the probe's peak
/// resident memory (VmHWM, KiB), sampled while it ran.
struct Run {
    code: Option<i32>,
    stdout: Vec<u8>,
    took: Duration,
    peak_kib: u64,
}

async fn run_probe(url: &str, flags: &[&str]) -> anyhow::Result<Run> {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .arg("probe")
        .arg(url)
        .args(flags)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or_default();
    let mut stdout = child.stdout.take().expect("piped");
    let reading = tokio::spawn(async move {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes).await;
        bytes
    });
    let mut peak_kib = 0;
    let status = tokio::time::timeout(PROBE_RUN, async {
        loop {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                if let Some(kib) = status
                    .lines()
                    .find_map(|line| line.strip_prefix("VmHWM:"))
                    .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                {
                    peak_kib = peak_kib.max(kib);
                }
            }
            tokio::select! {
                status = child.wait() => return status,
                // Sampling the high-water mark, not synchronisation.
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    })
    .await??;
    let stdout = tokio::time::timeout(PROBE_RUN, reading).await??;
    let run = Run {
        code: status.code(),
        stdout,
        took: started.elapsed(),
        peak_kib,
    };
    println!(
        "probe {url} {flags:?}: exit {:?} after {:?}, peak RSS {} KiB\n{}",
        run.code,
        run.took,
        run.peak_kib,
        String::from_utf8_lossy(&run.stdout)
    );
    Ok(run)
}

fn report(run: &Run) -> anyhow::Result<Value> {
    serde_json::from_slice(&run.stdout).map_err(|error| anyhow::anyhow!("no JSON report: {error}"))
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|check| check["name"] == name))
        .unwrap_or(&Value::Null)
}

/// Item 4: nothing a server sends reaches the terminal as a control
/// character: not in the text report (escape sequences, BEL, C1 controls,
/// bidirectional overrides are shown escaped), not raw in `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_text_never_reaches_the_terminal_raw() -> anyhow::Result<()> {
    let (_server, url) = hostile(Kind::Ansi).await?;
    for flags in [&["--timeout", "2s"][..], &["--timeout", "2s", "--json"][..]] {
        let run = run_probe(&url, flags).await?;
        let text = String::from_utf8(run.stdout.clone())?;
        for (bad, what) in [
            ('\u{1b}', "ESC"),
            ('\u{7}', "BEL"),
            ('\u{9b}', "C1 CSI"),
            ('\u{202e}', "RIGHT-TO-LEFT OVERRIDE"),
        ] {
            assert!(
                !text.contains(bad),
                "{what} reached the terminal raw ({flags:?})"
            );
        }
        assert!(text.contains("pwned"), "the name is still shown, escaped");
    }
    Ok(())
}

/// Item 5: a server that closes every POST stream after a priming event and
/// answers on `GET` + `Last-Event-ID` (SEP-1699) follows the spec; the probe
/// resumes and judges the answers (it reported BUG, exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_servers_are_resumed_not_reported() -> anyhow::Result<()> {
    let (_server, url) = hostile(Kind::Polling).await?;
    let run = run_probe(&url, &["--timeout", "2s", "--json", "--pairs", "4"]).await?;
    let report = report(&run)?;
    for name in ["same-id", "number-vs-string"] {
        assert_eq!(check(&report, name)["verdict"], "ok", "{report:#}");
    }
    assert_eq!(run.code, Some(0));
    Ok(())
}

/// Item 5: SSE lines may end with CR alone; such answers are read (they
/// were never found: BUG, exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cr_only_sse_answers_are_read() -> anyhow::Result<()> {
    let (_server, url) = hostile(Kind::CrOnly).await?;
    let run = run_probe(&url, &["--timeout", "2s", "--json", "--pairs", "4"]).await?;
    let report = report(&run)?;
    for name in ["same-id", "number-vs-string"] {
        assert_eq!(check(&report, name)["verdict"], "ok", "{report:#}");
    }
    assert_eq!(run.code, Some(0));
    Ok(())
}

/// Item 5: HTTP 500 to a duplicate is a server failure, not a refusal: its
/// own verdict, exit 1 (it was "ok-refused", exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_to_a_duplicate_is_not_ok() -> anyhow::Result<()> {
    let (_server, url) = hostile(Kind::FiveHundred).await?;
    let run = run_probe(&url, &["--timeout", "2s", "--json", "--pairs", "4"]).await?;
    let report = report(&run)?;
    let same_id = check(&report, "same-id");
    assert_eq!(same_id["verdict"], "server-error", "{same_id:#}");
    assert_eq!(same_id["counts"]["server_error"], 4, "{same_id:#}");
    assert_eq!(report["verdict"], "server-error");
    assert_eq!(run.code, Some(1));
    Ok(())
}

/// Item 5: a server that hangs on everything after its first answers is
/// done within a few `--timeout`s (4 at most, the probe's run limit), not
/// one per request wave and session (about 10 at `--timeout 1s`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_server_is_done_within_the_run_limit() -> anyhow::Result<()> {
    let (_server, url) = hostile(Kind::Hanging).await?;
    let run = run_probe(&url, &["--timeout", "1s", "--json"]).await?;
    let report = report(&run)?;
    assert_eq!(check(&report, "same-id")["verdict"], "bug", "{report:#}");
    assert_eq!(run.code, Some(1));
    assert!(
        run.took < Duration::from_millis(5_500),
        "the probe took {:?} at --timeout 1s",
        run.took
    );
    Ok(())
}

/// Item 5: 8 MiB answers (JSON and SSE) at `--concurrency 10` are judged as
/// they stream: the probe's peak memory stays small (it held every answer
/// whole, and parsed it: hundreds of MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_answers_are_judged_in_bounded_memory() -> anyhow::Result<()> {
    let (_server, url) = hostile(Kind::Huge).await?;
    let run = run_probe(
        &url,
        &[
            "--timeout",
            "10s",
            "--json",
            "--pairs",
            "10",
            "--concurrency",
            "10",
        ],
    )
    .await?;
    let report = report(&run)?;
    let same_id = check(&report, "same-id");
    assert_eq!(same_id["counts"]["own"], 20, "{same_id:#}");
    assert!(
        run.peak_kib < 64 * 1024,
        "peak RSS {} KiB with 20 answers of 8 MiB in flight",
        run.peak_kib
    );
    Ok(())
}
