//! `mcp-id-guard --upstream-port N -- COMMAND`: the binary runs its upstream
//! as a child process. The child is a few lines of Python (`python3 -c`, the
//! standard library's `http.server` on 127.0.0.1:$PORT), so that it is a
//! real separate program in another language, as a user's TypeScript or
//! Python server is. Its stderr is the guard's (inherited), so its lines
//! reach the test with the guard's log. Every wait is bounded; guard and
//! child are killed when a test ends early.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::support::process::{Guard, BIN};
use crate::support::OK_TIMEOUT;

/// A loopback port nothing listens on (bound and released: another program
/// could take it in between, which no test here does).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The child server: answers every GET with `child on <PORT>`; after
/// answering `/crash` it exits 3; on SIGTERM it says so and exits 7.
const SERVER: &str = r#"
import os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port = int(os.environ["PORT"])

def on_term(signum, frame):
    sys.stderr.write("child got SIGTERM\n")
    sys.stderr.flush()
    os._exit(7)

signal.signal(signal.SIGTERM, on_term)

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"child on {port}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if self.path == "/crash":
            sys.stderr.write("child crashing\n")
            sys.stderr.flush()
            os._exit(3)

    def log_message(self, *args):
        pass

sys.stderr.write(f"child pid {os.getpid()} serves port {port}\n")
sys.stderr.flush()
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"#;

/// Starts the guard with the Python server as its child on a free port.
async fn guard_with_child(extra: &[&str]) -> anyhow::Result<(Guard, u16)> {
    let port = free_port()?;
    let port_text = port.to_string();
    let mut args = vec!["--upstream-port", &port_text];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "python3", "-c", SERVER]);
    let guard = Guard::start(&args).await?;
    Ok((guard, port))
}

async fn get(url: &str) -> anyhow::Result<(u16, String)> {
    let client = reqwest::Client::builder().no_proxy().build()?;
    let response = tokio::time::timeout(OK_TIMEOUT, client.get(url).send()).await??;
    let status = response.status().as_u16();
    let body = tokio::time::timeout(OK_TIMEOUT, response.text()).await??;
    Ok((status, body))
}

/// The guard starts the child with PORT set, waits until it listens, and
/// only then serves: the first request through the guard reaches it.
#[tokio::test]
async fn the_child_is_started_and_requests_reach_it() -> anyhow::Result<()> {
    let (guard, port) = guard_with_child(&[]).await?;
    // The child said it listens before the guard's startup line.
    assert!(
        !guard.lines_with("child pid").is_empty(),
        "{:?}",
        guard.log()
    );
    let (status, body) = get(&format!("{}/hello", guard.base)).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, format!("child on {port}"));
    Ok(())
}

/// SIGTERM to the guard reaches the child, and the guard exits with the
/// child's exit code (7).
#[tokio::test]
async fn sigterm_is_passed_on_and_the_childs_exit_code_returned() -> anyhow::Result<()> {
    let (mut guard, _) = guard_with_child(&[]).await?;
    let signalled = Instant::now();
    guard.sigterm()?;
    guard.wait_for_line("child got SIGTERM").await?;
    let status = guard.wait_exit(OK_TIMEOUT).await?;
    println!(
        "exited {status} {:?} after SIGTERM; log: {:?}",
        signalled.elapsed(),
        guard.log()
    );
    assert_eq!(status.code(), Some(7), "{:?}", guard.log());
    Ok(())
}

/// A child that exits by itself while the guard serves: one ERROR line
/// naming its exit status, and the guard exits with its code (3).
#[tokio::test]
async fn a_crashing_child_stops_the_guard_with_its_exit_code() -> anyhow::Result<()> {
    let (mut guard, _) = guard_with_child(&[]).await?;
    let (status, body) = get(&format!("{}/crash", guard.base)).await?;
    assert_eq!(status, 200, "{body}");
    let line = guard.wait_for_line("ERROR").await?;
    assert!(line.contains("exit status: 3"), "{line}");
    let status = guard.wait_exit(OK_TIMEOUT).await?;
    assert_eq!(status.code(), Some(3), "{:?}", guard.log());
    assert_eq!(guard.lines_with("ERROR").len(), 1, "{:?}", guard.log());
    Ok(())
}

/// Runs the guard to its end (bounded) with a child that never listens
/// or exits early; returns its exit code and stderr. `output` also waits
/// for every holder of the guard's stderr, the child included: a child
/// left running would keep it open past the bound.
async fn run_to_end(extra: &[&str], child: &str) -> anyhow::Result<(Option<i32>, String)> {
    let port = free_port()?.to_string();
    let output = tokio::time::timeout(
        OK_TIMEOUT,
        Command::new(BIN)
            .args(["--listen", "127.0.0.1:0", "--upstream-port", &port])
            .args(extra)
            .args(["--", "python3", "-c", child])
            .env("RUST_LOG", "info")
            .env_remove("MCP_ID_GUARD_UPSTREAM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    Ok((output.status.code(), String::from_utf8(output.stderr)?))
}

/// A child that never listens: after --upstream-start-timeout the guard
/// says so in one line, kills the child and exits non-zero.
#[tokio::test]
async fn a_child_that_never_listens_is_killed_after_the_start_timeout() -> anyhow::Result<()> {
    let started = Instant::now();
    let (code, stderr) = run_to_end(
        &["--upstream-start-timeout", "2s"],
        "import os, sys, time\n\
         sys.stderr.write(f'child pid {os.getpid()}\\n'); sys.stderr.flush()\n\
         time.sleep(600)",
    )
    .await?;
    let elapsed = started.elapsed();
    println!("exited {code:?} after {elapsed:?}:\n{stderr}");
    assert!(code.is_some_and(|code| code != 0), "{code:?}\n{stderr}");
    assert!(elapsed >= Duration::from_secs(2), "{elapsed:?}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("did not accept connections") && errors[0].contains("2s"),
        "{stderr}"
    );
    assert!(!stderr.contains("listening on http"), "{stderr}");
    // The child is gone (killed and reaped), not left running.
    let pid = stderr
        .lines()
        .find_map(|line| line.strip_prefix("child pid "))
        .expect("the child's pid line")
        .trim()
        .to_owned();
    let alive = std::process::Command::new("kill")
        .args(["-0", &pid])
        .stderr(Stdio::null())
        .status()?;
    assert!(!alive.success(), "child {pid} still runs");
    Ok(())
}

/// A child that exits before it listens: the guard names its exit status
/// in one line and exits non-zero at once, without waiting out the timeout.
#[tokio::test]
async fn a_child_that_exits_before_listening_is_reported() -> anyhow::Result<()> {
    let started = Instant::now();
    let (code, stderr) = run_to_end(&[], "import sys; sys.exit(5)").await?;
    println!("exited {code:?} after {:?}:\n{stderr}", started.elapsed());
    assert!(code.is_some_and(|code| code != 0), "{code:?}\n{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("exit status: 5") && errors[0].contains("before"),
        "{stderr}"
    );
    Ok(())
}
