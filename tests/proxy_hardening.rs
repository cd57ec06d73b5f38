//! The `mcp-id-guard` binary facing the network (issue 12), spawned as a
//! process in front of a real rmcp 3.11 server on loopback: DNS-rebinding
//! protection (Host/Origin), timeouts for silent, trickling and idle clients
//! and for upstreams that never answer, the connection cap, and upstream
//! bounds. Each scenario first runs against the old behaviour (the check or
//! timeout turned off) to show it fails there. Time-based scenarios use
//! timeouts of a few hundred milliseconds; every wait is bounded and the
//! process is killed when a test ends early.
#![cfg(feature = "proxy")]

mod proxy_support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use proxy_support::{Outcome, Rmcp, Session, ACCEPT, OK_TIMEOUT, PROTOCOL_VERSION};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_mcp-id-guard");

/// A running `mcp-id-guard` process (killed on drop) and its log lines.
struct Guard {
    _child: Child,
    /// `http://127.0.0.1:<port>`, read from the startup line.
    base: String,
    /// `127.0.0.1:<port>`.
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Guard {
    /// Starts the binary on an ephemeral loopback port with `args` and waits
    /// for its startup line.
    async fn start(args: &[&str]) -> anyhow::Result<Self> {
        Self::start_in(None, args).await
    }

    /// As [`start`](Self::start), under `sh -c "ulimit -n <nofile>; exec ..."`
    /// when `nofile` is given.
    async fn start_in(nofile: Option<u32>, args: &[&str]) -> anyhow::Result<Self> {
        let mut command = match nofile {
            Some(nofile) => {
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
                    .arg(BIN);
                command
            }
            None => Command::new(BIN),
        };
        command
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("MCP_ID_GUARD_UPSTREAM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
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
        let addr = base.trim_start_matches("http://").to_owned();
        Ok(Self {
            _child: child,
            base,
            addr,
            log,
        })
    }

    fn url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// Waits (bounded) until a log line contains `text`; returns every such
    /// line so far. Lines reach the test through a pipe and a reader task,
    /// so a line written before a response may arrive after it.
    async fn wait_for_lines(&self, text: &str) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + OK_TIMEOUT;
        loop {
            let lines = self.lines_with(text);
            if !lines.is_empty() {
                return Ok(lines);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no {text:?} in {:?}",
                self.log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Log lines containing `text` so far.
    fn lines_with(&self, text: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains(text))
            .cloned()
            .collect()
    }
}

/// The `initialize` request a client (or a rebound page) sends first.
fn initialize() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": { "name": "hardening-test", "version": "0" }
        }
    })
}

/// POSTs `message` to `url` with extra headers; returns the status and body.
async fn post_with(
    url: &str,
    headers: &[(&str, &str)],
    message: &Value,
) -> anyhow::Result<(u16, String)> {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("accept", ACCEPT)
        .header("content-type", "application/json")
        .body(message.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = tokio::time::timeout(OK_TIMEOUT, request.send()).await??;
    let status = response.status().as_u16();
    let body = tokio::time::timeout(OK_TIMEOUT, response.text()).await??;
    Ok((status, body))
}

/// What a page on `evil.example:8080` sends once its name points at the
/// proxy's loopback address.
const REBOUND: [(&str, &str); 2] = [
    ("host", "evil.example:8080"),
    ("origin", "http://evil.example:8080"),
];

// ---------------------------------------------------------------------------
// Every layer setting is a flag
// ---------------------------------------------------------------------------

#[tokio::test]
async fn help_lists_the_new_options_and_their_env_vars() -> anyhow::Result<()> {
    let output =
        tokio::time::timeout(OK_TIMEOUT, Command::new(BIN).arg("--help").output()).await??;
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout)?;
    for expected in [
        "--abandoned-id-ttl",
        "MCP_ID_GUARD_ABANDONED_ID_TTL",
        "--reject-status",
        "--allowed-hosts",
        "MCP_ID_GUARD_ALLOWED_HOSTS",
        "--allowed-origins",
        "MCP_ID_GUARD_ALLOWED_ORIGINS",
        "--allow-any-host",
        "--allow-any-origin",
        "--preserve-host",
        "MCP_ID_GUARD_PRESERVE_HOST",
    ] {
        assert!(help.contains(expected), "{expected} missing from:\n{help}");
    }
    Ok(())
}

/// `--reject-status` takes any 4xx code (it took only 400 and 409), and
/// refuses what is not one.
#[tokio::test]
async fn reject_status_is_any_4xx() -> anyhow::Result<()> {
    let rmcp = Rmcp::start().await?;
    let guard = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--on-duplicate",
        "reject",
        "--reject-status",
        "422",
        "--abandoned-id-ttl",
        "0",
    ])
    .await?;
    let session = Session::open(&guard.url()).await?;
    rmcp.holds.hold("A");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "A", 0, OK_TIMEOUT).await }
    });
    rmcp.wait_started(&["A"]).await?;
    assert_eq!(
        session.echo(json!(1), "B", 0, OK_TIMEOUT).await,
        Outcome::Rejected {
            status: 422,
            id: json!(1),
            code: -32600
        }
    );
    rmcp.holds.release("A");
    assert_eq!(a.await?, Outcome::Own);

    for bad in ["200", "500", "4xx"] {
        let output = tokio::time::timeout(
            OK_TIMEOUT,
            Command::new(BIN)
                .args(["--upstream", &rmcp.base, "--reject-status", bad])
                .output(),
        )
        .await??;
        assert!(!output.status.success(), "--reject-status {bad} accepted");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// DNS rebinding
// ---------------------------------------------------------------------------

/// A rebound page's `initialize`, `tools/call` and GET stream: rmcp itself
/// refuses them (403), the old proxy configuration (no checks, which
/// `--allow-any-host --allow-any-origin` keeps) let them through, and the
/// default now refuses them: 421 for the Host, 403 for the Origin, each a
/// JSON-RPC error. Loopback names and origins still pass.
#[tokio::test]
async fn rebound_requests_are_refused() -> anyhow::Result<()> {
    let rmcp = Rmcp::start().await?;

    // rmcp's own protection, which the proxy's Host rewrite hides.
    let (status, _) = post_with(&rmcp.url, &REBOUND, &initialize()).await?;
    assert_eq!(status, 403, "rmcp itself refuses a rebound Host");

    // Control: the old behaviour.
    let open = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--allow-any-host",
        "--allow-any-origin",
    ])
    .await?;
    let (status, body) = post_with(&open.url(), &REBOUND, &initialize()).await?;
    assert_eq!(
        status, 200,
        "control: the rebound initialize passed: {body}"
    );
    let session = Session::open(&open.url()).await?;
    let call = json!({
        "jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": { "name": "echo", "arguments": { "sentinel": "rebound" } }
    });
    let session_headers = [
        REBOUND[0],
        REBOUND[1],
        ("mcp-session-id", session.id.as_str()),
        ("mcp-protocol-version", PROTOCOL_VERSION),
    ];
    let (status, body) = post_with(&open.url(), &session_headers, &call).await?;
    assert_eq!(status, 200, "control: the rebound tools/call ran: {body}");
    assert!(body.contains("ECHO:rebound"), "{body}");
    println!("control (no checks): rebound initialize and tools/call answered 200");

    // Now: the default on a loopback listener.
    let guard = Guard::start(&["--upstream", &rmcp.base]).await?;
    let (status, body) = post_with(&guard.url(), &REBOUND, &initialize()).await?;
    assert_eq!(status, 421, "{body}");
    let error: Value = serde_json::from_str(&body)?;
    assert_eq!(error["error"]["code"], -32600);
    assert_eq!(error["id"], Value::Null);
    let session = Session::open(&guard.url()).await?;
    let session_headers = [
        REBOUND[0],
        REBOUND[1],
        ("mcp-session-id", session.id.as_str()),
        ("mcp-protocol-version", PROTOCOL_VERSION),
    ];
    let refused_call = json!({
        "jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": { "name": "echo", "arguments": { "sentinel": "refused" } }
    });
    let (status, _) = post_with(&guard.url(), &session_headers, &refused_call).await?;
    assert_eq!(status, 421);
    assert_eq!(
        rmcp.started_so_far().await,
        ["rebound"],
        "a refused call reached the tool"
    );
    let stream = tokio::time::timeout(
        OK_TIMEOUT,
        reqwest::Client::new()
            .get(guard.url())
            .header("accept", "text/event-stream")
            .header("host", "evil.example:8080")
            .header("mcp-session-id", &session.id)
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .send(),
    )
    .await??;
    assert_eq!(stream.status(), 421, "the GET stream opened");

    // Host right (the page used the proxy's real address), Origin foreign.
    let local_host = guard.addr.clone();
    let (status, body) = post_with(
        &guard.url(),
        &[
            ("host", &local_host),
            ("origin", "http://evil.example:8080"),
        ],
        &initialize(),
    )
    .await?;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body)?["error"]["code"],
        -32600
    );

    // Legitimate: loopback names, a loopback origin, or no origin.
    for (host, origin) in [
        (format!("localhost:{}", 8080), Some("http://localhost:5173")),
        (local_host.clone(), None),
        ("[::1]:8080".to_owned(), Some("http://127.0.0.1:3000")),
    ] {
        let mut headers = vec![("host", host.as_str())];
        headers.extend(origin.map(|origin| ("origin", origin)));
        let (status, body) = post_with(&guard.url(), &headers, &initialize()).await?;
        assert_eq!(status, 200, "{host} {origin:?}: {body}");
    }
    assert_eq!(
        session.echo(json!(1), "legit", 0, OK_TIMEOUT).await,
        Outcome::Own
    );
    println!("default: rebound requests refused (421 Host, 403 Origin); loopback ones served");
    Ok(())
}

/// A burst of rebound requests is logged once per kind, not once each.
#[tokio::test]
async fn refusals_are_logged_at_a_bounded_rate() -> anyhow::Result<()> {
    let rmcp = Rmcp::start().await?;
    let guard = Guard::start(&["--upstream", &rmcp.base]).await?;
    for _ in 0..50 {
        let (status, _) = post_with(&guard.url(), &REBOUND, &initialize()).await?;
        assert_eq!(status, 421);
    }
    let local_host = guard.addr.clone();
    for _ in 0..50 {
        let headers = [("host", local_host.as_str()), REBOUND[1]];
        let (status, _) = post_with(&guard.url(), &headers, &initialize()).await?;
        assert_eq!(status, 403);
    }
    // Every refusal was answered, so every line about them has been written.
    guard
        .wait_for_lines("refused a request with Origin")
        .await?;
    let hosts = guard.lines_with("refused a request with Host");
    let origins = guard.lines_with("refused a request with Origin");
    println!(
        "50 + 50 refusals, log lines: {} Host, {} Origin",
        hosts.len(),
        origins.len()
    );
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(origins.len(), 1, "{origins:?}");
    assert!(hosts[0].contains("evil.example:8080"), "{hosts:?}");
    Ok(())
}

/// Named hosts and origins replace the loopback defaults; `--preserve-host`
/// hands the client's Host to the upstream, whose own check then applies as
/// a second layer (rmcp refuses a Host it does not know, 403).
#[tokio::test]
async fn named_hosts_and_preserved_host() -> anyhow::Result<()> {
    let rmcp = Rmcp::start().await?;
    let guard = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--allowed-hosts",
        "mcp.example.com,localhost:*",
        "--allowed-origins",
        "https://app.example.com",
    ])
    .await?;
    let named = [
        ("host", "mcp.example.com:8080"),
        ("origin", "https://app.example.com"),
    ];
    let (status, body) = post_with(&guard.url(), &named, &initialize()).await?;
    assert_eq!(status, 200, "{body}");
    let (status, _) = post_with(&guard.url(), &[("host", "127.0.0.1:1")], &initialize()).await?;
    assert_eq!(status, 421, "127.0.0.1 is no longer listed");
    let loopback_origin = [("host", "localhost:1"), ("origin", "http://localhost:1")];
    let (status, _) = post_with(&guard.url(), &loopback_origin, &initialize()).await?;
    assert_eq!(status, 403, "loopback origins are no longer listed");

    // The upstream's own check as a second layer.
    let preserving = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--allowed-hosts",
        "mcp.example.com",
        "--preserve-host",
    ])
    .await?;
    let (status, _) = post_with(
        &preserving.url(),
        &[("host", "mcp.example.com")],
        &initialize(),
    )
    .await?;
    assert_eq!(status, 403, "rmcp saw the client's Host and refused it");
    let (status, _) =
        post_with(&guard.url(), &[("host", "mcp.example.com")], &initialize()).await?;
    assert_eq!(
        status, 200,
        "without --preserve-host rmcp sees its own address"
    );
    Ok(())
}

/// On a non-loopback address the operator must name the hosts (or opt out).
#[tokio::test]
async fn non_loopback_listener_needs_named_hosts() -> anyhow::Result<()> {
    let output = tokio::time::timeout(
        OK_TIMEOUT,
        Command::new(BIN)
            .args(["--listen", "0.0.0.0:0", "--upstream", "http://127.0.0.1:9"])
            .output(),
    )
    .await??;
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr)?;
    assert!(stderr.contains("--allowed-hosts"), "{stderr}");
    let output = tokio::time::timeout(
        OK_TIMEOUT,
        Command::new(BIN)
            .args([
                "--upstream",
                "http://127.0.0.1:9",
                "--allowed-hosts",
                "user@host",
            ])
            .output(),
    )
    .await??;
    assert!(!output.status.success(), "a bad pattern was accepted");
    Ok(())
}
