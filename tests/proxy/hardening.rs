//! The `mcp-id-guard` binary facing the network (issue 12), spawned as a
//! process in front of a real rmcp 3.11 server on loopback: DNS-rebinding
//! protection (Host/Origin), timeouts for silent, trickling and idle clients
//! and for upstreams that never answer, the connection cap, and upstream
//! bounds. Each scenario first runs against the old behaviour (the check or
//! timeout turned off) to show it fails there. Time-based scenarios use
//! timeouts of a few hundred milliseconds; every wait is bounded and the
//! process is killed when a test ends early.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::client::{initialize_message, Session};
use crate::support::process::{Guard, BIN};
use crate::support::proxy::{duplicate_while_held, Outcome};
use crate::support::server::{refused_port, serve_service, upstream, Served};
use crate::support::{ACCEPT, OK_TIMEOUT, PROTOCOL_VERSION};
use anyhow::Context as _;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio::sync::mpsc;

/// The `initialize` this file's clients send.
fn initialize() -> Value {
    initialize_message("hardening-test")
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
        "--trust-forwarded",
        "MCP_ID_GUARD_TRUST_FORWARDED",
        "--header-read-timeout",
        "MCP_ID_GUARD_HEADER_READ_TIMEOUT",
        "--request-body-timeout",
        "MCP_ID_GUARD_REQUEST_BODY_TIMEOUT",
        "--keep-alive-timeout",
        "MCP_ID_GUARD_KEEP_ALIVE_TIMEOUT",
        "--send-timeout",
        "MCP_ID_GUARD_SEND_TIMEOUT",
        "--upstream-response-timeout",
        "MCP_ID_GUARD_UPSTREAM_RESPONSE_TIMEOUT",
        "--upstream-idle-timeout",
        "MCP_ID_GUARD_UPSTREAM_IDLE_TIMEOUT",
        "--max-connections",
        "MCP_ID_GUARD_MAX_CONNECTIONS",
        "--max-upstream-connections",
        "MCP_ID_GUARD_MAX_UPSTREAM_CONNECTIONS",
        "--upstream-queue-timeout",
        "MCP_ID_GUARD_UPSTREAM_QUEUE_TIMEOUT",
        "--pool-idle-timeout",
        "MCP_ID_GUARD_POOL_IDLE_TIMEOUT",
        "--max-header-bytes",
        "MCP_ID_GUARD_MAX_HEADER_BYTES",
        "--admin-listen",
        "MCP_ID_GUARD_ADMIN_LISTEN",
        "--admin-max-connections",
        "MCP_ID_GUARD_ADMIN_MAX_CONNECTIONS",
        "--admin-send-timeout",
        "MCP_ID_GUARD_ADMIN_SEND_TIMEOUT",
        "--admin-header-read-timeout",
        "MCP_ID_GUARD_ADMIN_HEADER_READ_TIMEOUT",
        "--max-body-memory-bytes",
        "MCP_ID_GUARD_MAX_BODY_MEMORY_BYTES",
        "--max-body-memory-per-connection",
        "MCP_ID_GUARD_MAX_BODY_MEMORY_PER_CONNECTION",
        "--max-body-memory-per-client",
        "MCP_ID_GUARD_MAX_BODY_MEMORY_PER_CLIENT",
        "--log-format",
        "MCP_ID_GUARD_LOG_FORMAT",
        "--max-requests-per-connection",
        "MCP_ID_GUARD_MAX_REQUESTS_PER_CONNECTION",
        "--max-client-resets",
        "MCP_ID_GUARD_MAX_CLIENT_RESETS",
        "--client-reset-window",
        "MCP_ID_GUARD_CLIENT_RESET_WINDOW",
    ] {
        assert!(help.contains(expected), "{expected} missing from:\n{help}");
    }
    Ok(())
}

/// `--reject-status` takes any 4xx code (it took only 400 and 409), and
/// refuses what is not one.
#[tokio::test]
async fn reject_status_is_any_4xx() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
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
    assert_eq!(
        duplicate_while_held(&rmcp, &session).await?,
        Outcome::Rejected {
            status: 422,
            id: json!(1),
            code: -32600
        }
    );

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
    let rmcp = upstream().await?;

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
    let rmcp = upstream().await?;
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
    let rmcp = upstream().await?;
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

// ---------------------------------------------------------------------------
// Clients that never finish: raw sockets
// ---------------------------------------------------------------------------

/// How long a control case watches a connection that must stay open.
const STAYS_OPEN: Duration = Duration::from_millis(1500);
/// The short limits the tests configure.
const SHORT: &str = "300ms";

/// Reads until the proxy closes the connection (EOF or reset) or `within`
/// passes; returns how long the connection lasted from `since`, or `None` when
/// it is still open. Anything the proxy answers first is read and ignored.
async fn closed_within(
    stream: &mut TcpStream,
    since: Instant,
    within: Duration,
) -> Option<Duration> {
    let mut buffer = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read_all).await.ok()
}

/// What each misbehaving client sends before falling silent.
#[derive(Debug, Clone, Copy)]
enum Silent {
    Nothing,
    /// 16 bytes of the HTTP/2 client preface.
    PartialPreface,
    /// The whole 24-byte preface, then no SETTINGS frame.
    FullPreface,
    /// Half an HTTP/1.1 request head.
    PartialHead,
    /// One whole request (answered by the proxy itself), then nothing.
    KeptAlive,
    /// One whole request, 500 ms idle, then half of the next request head.
    PartialHeadAfterRequest,
    /// A POST whose body trickles one byte per 600 ms (twice the limit).
    TricklingBody,
}

const SILENT: [Silent; 6] = [
    Silent::Nothing,
    Silent::PartialPreface,
    Silent::FullPreface,
    Silent::PartialHead,
    Silent::KeptAlive,
    Silent::TricklingBody,
];

/// Opens a connection to `addr`, sends what `kind` sends, and watches it for
/// `within`: how long it lasted from the moment the client fell silent
/// (`None`: still open).
async fn misbehave(addr: &str, kind: Silent, within: Duration) -> anyhow::Result<Option<Duration>> {
    let mut stream = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(addr)).await??;
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    match kind {
        Silent::Nothing => {}
        Silent::PartialPreface => stream.write_all(&PREFACE[..16]).await?,
        Silent::FullPreface => stream.write_all(PREFACE).await?,
        Silent::PartialHead => {
            stream
                .write_all(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: app")
                .await?
        }
        Silent::KeptAlive | Silent::PartialHeadAfterRequest => {
            // A refused Host: the proxy answers without the upstream.
            stream
                .write_all(b"GET /mcp HTTP/1.1\r\nHost: evil.example\r\n\r\n")
                .await?;
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                anyhow::ensure!(
                    stream.read(&mut byte).await? == 1,
                    "closed before answering"
                );
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_string();
            anyhow::ensure!(head.starts_with("HTTP/1.1 421"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .context("no content-length")?
                .trim()
                .parse()?;
            let mut body = vec![0u8; length];
            stream.read_exact(&mut body).await?;
            if let Silent::PartialHeadAfterRequest = kind {
                // Idle past the first head's limit first: the watchdog has
                // then looked at the idle connection and set its 5s limit.
                tokio::time::sleep(Duration::from_millis(500)).await;
                stream
                    .write_all(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: app")
                    .await?;
            }
        }
        Silent::TricklingBody => {
            let since = Instant::now();
            stream
                .write_all(
                    b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                      Accept: application/json, text/event-stream\r\nMcp-Session-Id: s\r\n\
                      Content-Length: 64\r\n\r\n{",
                )
                .await?;
            // One more byte every 600 ms while watching for the close.
            let mut buffer = [0u8; 4096];
            loop {
                let pause = tokio::time::sleep(Duration::from_millis(600));
                tokio::pin!(pause);
                loop {
                    tokio::select! {
                        read = stream.read(&mut buffer) => match read {
                            Ok(0) | Err(_) => return Ok(Some(since.elapsed())),
                            Ok(_) => {}
                        },
                        () = &mut pause => break,
                    }
                }
                if since.elapsed() > within {
                    return Ok(None);
                }
                if stream.write_all(b" ").await.is_err() {
                    return Ok(Some(since.elapsed()));
                }
            }
        }
    }
    Ok(closed_within(&mut stream, Instant::now(), within).await)
}

/// A connection that sends nothing, part of the HTTP/2 preface, the whole
/// preface, half a request head, nothing after a request, or a body one byte
/// at a time: with the limits off (the old proxy) each is still open after
/// 1.5 s; with 300 ms limits each is closed soon after 300 ms.
#[tokio::test]
async fn silent_and_trickling_clients_are_closed() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let off = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--header-read-timeout",
        "0",
        "--keep-alive-timeout",
        "0",
        "--request-body-timeout",
        "0",
    ])
    .await?;
    let on = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--header-read-timeout",
        SHORT,
        "--keep-alive-timeout",
        SHORT,
        "--request-body-timeout",
        SHORT,
    ])
    .await?;

    let control =
        futures::future::join_all(SILENT.map(|kind| misbehave(&off.addr, kind, STAYS_OPEN)));
    let limited =
        futures::future::join_all(SILENT.map(|kind| misbehave(&on.addr, kind, OK_TIMEOUT)));
    let (control, limited) = tokio::join!(control, limited);
    for ((kind, control), limited) in SILENT.iter().zip(control).zip(limited) {
        let (control, limited) = (control?, limited?);
        println!("{kind:?}: limits off: {control:?}; limits {SHORT}: closed after {limited:?}");
        assert_eq!(control, None, "{kind:?}: closed without a limit");
        let lasted = limited.with_context(|| format!("{kind:?}: not closed"))?;
        assert!(
            lasted >= Duration::from_millis(250),
            "{kind:?}: closed too early ({lasted:?})"
        );
        assert!(
            lasted < Duration::from_secs(3),
            "{kind:?}: closed late ({lasted:?})"
        );
    }

    // A client that works normally is not disturbed by the short limits.
    let session = Session::open(&on.url()).await?;
    for id in 1..=3 {
        assert_eq!(
            session.echo(json!(id), "normal", 0, OK_TIMEOUT).await,
            Outcome::Own
        );
    }
    Ok(())
}

/// The watchdog is not woken per request: after a request, the next head's
/// shorter limit must still hold. With `--header-read-timeout 300ms` and
/// `--keep-alive-timeout 5s`, half a head sent 500 ms after a whole request
/// is cut about 300 ms later, while a connection that only stays idle is
/// kept.
#[tokio::test]
async fn a_later_head_gets_its_own_shorter_limit() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--header-read-timeout",
        SHORT,
        "--keep-alive-timeout",
        "5s",
    ])
    .await?;
    let (partial, idle) = tokio::join!(
        misbehave(&guard.addr, Silent::PartialHeadAfterRequest, OK_TIMEOUT),
        misbehave(&guard.addr, Silent::KeptAlive, STAYS_OPEN),
    );
    let lasted = partial?.context("half a head after a request: not closed")?;
    println!("half a head after a request: closed after {lasted:?}");
    assert!(
        (Duration::from_millis(250)..STAYS_OPEN).contains(&lasted),
        "half a head after a request: closed after {lasted:?}, not about {SHORT}"
    );
    assert_eq!(idle?, None, "an idle connection closed before its 5s limit");
    Ok(())
}

// ---------------------------------------------------------------------------
// Upstreams that never answer, fall silent, or stream slowly but alive
// ---------------------------------------------------------------------------

/// A hand-made upstream: `/never` never answers; `/sse-silent` opens an SSE
/// stream and then sends nothing; `/sse-alive` sends a keep-alive comment
/// every 100 ms for 1.2 s, then the answer to id 7; `/fast` answers id 7 at
/// once.
async fn slow_upstream() -> anyhow::Result<Served> {
    use http_body_util::{combinators::UnsyncBoxBody, BodyExt, StreamBody};
    type Out = UnsyncBoxBody<bytes::Bytes, std::convert::Infallible>;
    let sse = |frames: futures::stream::BoxStream<'static, &'static str>| -> http::Response<Out> {
        use futures::StreamExt;
        let body = StreamBody::new(frames.map(|text| {
            Ok(http_body::Frame::data(bytes::Bytes::from_static(
                text.as_bytes(),
            )))
        }));
        http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(BodyExt::boxed_unsync(body))
            .unwrap()
    };
    let service = tower::service_fn(
        move |request: http::Request<hyper::body::Incoming>| async move {
            use futures::StreamExt;
            let response = match request.uri().path() {
                "/never" => futures::future::pending().await,
                "/fast" => sse(futures::stream::once(async {
                    "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n"
                })
                .boxed()),
                "/sse-silent" => sse(futures::stream::once(async { ": open\n\n" })
                    .chain(futures::stream::pending())
                    .boxed()),
                _ => sse(futures::stream::unfold(0u32, |sent| async move {
                    match sent {
                        0..=11 => {
                            // The server's own pacing, not synchronisation.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            Some((": keep-alive\n\n", sent + 1))
                        }
                        12 => Some((
                            "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":true}}\n\n",
                            sent + 1,
                        )),
                        _ => None,
                    }
                })
                .boxed()),
            };
            Ok::<_, std::convert::Infallible>(response)
        },
    );
    serve_service(service).await
}

/// POSTs a request with id 7 in session `s` to `url`; returns the status and
/// the body, or `None` for what has not arrived within `within`.
async fn call_slow(url: &str, within: Duration) -> (Option<u16>, Option<Result<String, String>>) {
    let request = reqwest::Client::new()
        .post(url)
        .header("accept", ACCEPT)
        .header("content-type", "application/json")
        .header("mcp-session-id", "s")
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .body(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}).to_string());
    let deadline = tokio::time::Instant::now() + within;
    let Ok(Ok(response)) = tokio::time::timeout_at(deadline, request.send()).await else {
        return (None, None);
    };
    let status = response.status().as_u16();
    match tokio::time::timeout_at(deadline, response.text()).await {
        Ok(body) => (
            Some(status),
            Some(body.map_err(|error| format!("{error:#}"))),
        ),
        Err(_) => (Some(status), None),
    }
}

/// An upstream that never answers: awaited for ever with the timeout off
/// (the old proxy), `504` with a JSON-RPC error carrying the request's id
/// after 400 ms now. A stream that falls silent: open for ever before, cut
/// after 400 ms now. A stream kept alive by comments outlives the limit
/// threefold and delivers its answer.
#[tokio::test]
async fn upstream_timeouts_spare_live_streams() -> anyhow::Result<()> {
    let upstream = slow_upstream().await?;
    let base = format!("http://{}", upstream.addr);
    let off = Guard::start(&[
        "--upstream",
        &base,
        "--upstream-response-timeout",
        "0",
        "--upstream-idle-timeout",
        "0",
    ])
    .await?;
    let on = Guard::start(&[
        "--upstream",
        &base,
        "--upstream-response-timeout",
        "400ms",
        "--upstream-idle-timeout",
        "400ms",
    ])
    .await?;

    let (never_url, silent_url) = (
        format!("{}/never", off.base),
        format!("{}/sse-silent", off.base),
    );
    let (never, silent) = tokio::join!(
        call_slow(&never_url, STAYS_OPEN),
        call_slow(&silent_url, STAYS_OPEN),
    );
    println!("limits off: /never {never:?}, /sse-silent {silent:?} after {STAYS_OPEN:?}");
    assert_eq!(never, (None, None), "control: the never-answering upstream");
    assert_eq!(silent, (Some(200), None), "control: the silent stream");

    let started = Instant::now();
    let (never, silent, alive) = tokio::join!(
        async {
            let answer = call_slow(&format!("{}/never", on.base), OK_TIMEOUT).await;
            (answer, started.elapsed())
        },
        async {
            let answer = call_slow(&format!("{}/sse-silent", on.base), OK_TIMEOUT).await;
            (answer, started.elapsed())
        },
        async {
            let answer = call_slow(&format!("{}/sse-alive", on.base), OK_TIMEOUT).await;
            (answer, started.elapsed())
        },
    );
    println!("limits 400ms: /never {never:?}\n/sse-silent {silent:?}\n/sse-alive {alive:?}");
    let ((status, body), took) = never;
    assert_eq!(status, Some(504));
    let error: Value =
        serde_json::from_str(&body.context("no body")?.map_err(anyhow::Error::msg)?)?;
    assert_eq!(error["id"], 7, "{error}");
    assert_eq!(error["error"]["code"], -32603);
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let ((status, body), took) = silent;
    assert_eq!(status, Some(200));
    assert!(
        matches!(body, Some(Err(_))),
        "the silent stream was not cut: {body:?}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    let ((status, body), took) = alive;
    assert_eq!(status, Some(200));
    let body = body.context("no body")?.map_err(anyhow::Error::msg)?;
    assert!(body.contains(r#""id":7,"result""#), "{body}");
    assert!(took >= Duration::from_millis(1200), "{took:?}");

    // A connection back from the pool keeps its timer for the next request:
    // the deadline is moved on, and still holds.
    for _ in 0..2 {
        let (status, body) = call_slow(&format!("{}/fast", on.base), OK_TIMEOUT).await;
        assert_eq!(status, Some(200));
        assert!(matches!(body, Some(Ok(_))), "{body:?}");
    }
    let started = Instant::now();
    let (status, body) = call_slow(&format!("{}/never", on.base), OK_TIMEOUT).await;
    let took = started.elapsed();
    assert_eq!(status, Some(504), "{body:?}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Descriptors: the connection cap
// ---------------------------------------------------------------------------

/// Opens `count` connections to `addr` that never send anything.
async fn silent_sockets(addr: &str, count: usize) -> anyhow::Result<Vec<TcpStream>> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        sockets.push(tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(addr)).await??);
    }
    Ok(sockets)
}

/// Under `ulimit -n 64`, 80 silent connections: with no cap and no head
/// timeout (the old proxy), the process runs out of descriptors and a
/// legitimate client is never served (and `accept` failures are logged at a
/// bounded rate, not per attempt). With the default cap derived from the
/// limit (16) and a 300 ms head timeout, the proxy stops accepting at the cap
/// instead of failing, the silent connections are closed in turn, and the
/// legitimate client is served.
#[tokio::test]
async fn connection_cap_keeps_descriptors_for_real_clients() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let old = Guard::start_in(
        Some(64),
        &[
            "--upstream",
            &rmcp.base,
            "--max-connections",
            "100000",
            "--header-read-timeout",
            "0",
        ],
    )
    .await?;
    let _held = silent_sockets(&old.addr, 80).await?;
    let served = tokio::time::timeout(Duration::from_secs(2), Session::open(&old.url())).await;
    assert!(
        !matches!(served, Ok(Ok(_))),
        "control: a client was served with the descriptors exhausted"
    );
    let failures = old.wait_for_lines("accept failed").await?;
    println!(
        "control: client not served; {} 'accept failed' line(s) in 2 s: {:?}",
        failures.len(),
        failures.first()
    );
    assert!(failures.len() <= 2, "{failures:#?}");
    drop(_held);
    drop(old);

    let new = Guard::start_in(
        Some(64),
        &["--upstream", &rmcp.base, "--header-read-timeout", SHORT],
    )
    .await?;
    new.wait_for_lines("at most 16 open (descriptor limit 64)")
        .await?;
    let _held = silent_sockets(&new.addr, 80).await?;
    let started = Instant::now();
    let session = tokio::time::timeout(OK_TIMEOUT, Session::open(&new.url())).await??;
    let waited = started.elapsed();
    assert_eq!(
        session.echo(json!(1), "served", 0, OK_TIMEOUT).await,
        Outcome::Own
    );
    println!("default cap 16: client served after {waited:?} behind 80 silent connections");
    assert!(new.lines_with("accept failed").is_empty());
    assert!(!new.lines_with("client connections open").is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------
// Upstream bounds
// ---------------------------------------------------------------------------

/// A hand-made upstream that holds every request until released and records
/// which connections (client ports) it was reached on.
struct Counting {
    served: Served,
    arrived: tokio::sync::Mutex<mpsc::UnboundedReceiver<std::net::SocketAddr>>,
    release: tokio::sync::watch::Sender<bool>,
    peers: Arc<Mutex<std::collections::HashSet<std::net::SocketAddr>>>,
}

impl Counting {
    async fn start() -> anyhow::Result<Self> {
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let (release, released) = tokio::sync::watch::channel(false);
        let peers = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let seen = Arc::clone(&peers);
        let service = tower::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let peer = request
                .extensions()
                .get::<mcp_id_guard::proxy::ClientAddr>()
                .map(|addr| addr.0);
            let (arrived_tx, mut released, seen) =
                (arrived_tx.clone(), released.clone(), Arc::clone(&seen));
            async move {
                if let Some(peer) = peer {
                    seen.lock().unwrap().insert(peer);
                    let _ = arrived_tx.send(peer);
                }
                if request.uri().path() == "/hold" {
                    let _ = released.wait_for(|released| *released).await;
                }
                // Answer the request's own id.
                use http_body_util::BodyExt;
                let body = request
                    .into_body()
                    .collect()
                    .await
                    .map(|body| body.to_bytes());
                let id = body
                    .ok()
                    .and_then(|body| serde_json::from_slice::<Value>(&body).ok())
                    .map_or(Value::Null, |message| message["id"].clone());
                let answer = json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string();
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header("content-type", "application/json")
                        .body(http_body_util::Full::new(bytes::Bytes::from(answer)))
                        .unwrap(),
                )
            }
        });
        Ok(Self {
            served: serve_service(service).await?,
            arrived: tokio::sync::Mutex::new(arrived),
            release,
            peers,
        })
    }

    fn base(&self) -> String {
        format!("http://{}", self.served.addr)
    }

    /// Waits (bounded) for `count` more requests to arrive.
    async fn wait_arrivals(&self, count: usize) -> anyhow::Result<()> {
        let mut arrived = self.arrived.lock().await;
        for _ in 0..count {
            tokio::time::timeout(OK_TIMEOUT, arrived.recv())
                .await
                .context("requests did not arrive")?;
        }
        Ok(())
    }

    /// Requests that arrived within `window`, beyond those waited for.
    async fn more_arrivals(&self, window: Duration) -> usize {
        let mut arrived = self.arrived.lock().await;
        let mut count = 0;
        while let Ok(Some(_)) = tokio::time::timeout(window, arrived.recv()).await {
            count += 1;
        }
        count
    }

    fn connections(&self) -> usize {
        self.peers.lock().unwrap().len()
    }
}

/// POSTs a JSON request with `id` (in session `s`) to `url`.
async fn post_id(url: &str, id: u64) -> anyhow::Result<(u16, Value)> {
    let (status, body) = post_with(
        url,
        &[
            ("mcp-session-id", "s"),
            ("mcp-protocol-version", PROTOCOL_VERSION),
        ],
        &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {}}),
    )
    .await?;
    Ok((
        status,
        serde_json::from_str(&body).with_context(|| body.clone())?,
    ))
}

/// 40 concurrent requests the upstream holds: without a cap (the old
/// proxy) they open 40 upstream connections; with `--max-upstream-connections
/// 8` at most 8 reach the upstream, the rest wait for a connection and all 40
/// are answered, over 8 connections, once the upstream lets go.
#[tokio::test]
async fn upstream_connections_are_capped() -> anyhow::Result<()> {
    for (cap, expected) in [("100000", 40), ("8", 8)] {
        let upstream = Counting::start().await?;
        let guard = Guard::start(&[
            "--upstream",
            &upstream.base(),
            "--max-upstream-connections",
            cap,
            "--upstream-queue-timeout",
            "10s",
        ])
        .await?;
        let url = format!("{}/hold", guard.base);
        let calls: Vec<_> = (1..=40u64)
            .map(|id| {
                let url = url.clone();
                tokio::spawn(async move { post_id(&url, id).await })
            })
            .collect();
        upstream.wait_arrivals(expected).await?;
        let extra = upstream.more_arrivals(Duration::from_millis(300)).await;
        assert_eq!(extra, 0, "cap {cap}: more requests reached the upstream");
        let connections = upstream.connections();
        let _ = upstream.release.send(true);
        for (id, call) in (1..=40u64).zip(calls) {
            let (status, answer) = call.await??;
            assert_eq!((status, &answer["id"]), (200, &json!(id)), "{answer}");
        }
        println!(
            "cap {cap}: {expected} requests at the upstream at once, {connections} upstream connections; \
             all 40 answered, {} connections in all",
            upstream.connections()
        );
        assert_eq!(connections, expected);
        assert!(upstream.connections() <= expected);
    }
    Ok(())
}

/// With every upstream connection busy past `--upstream-queue-timeout`, a
/// request gets `503` with a JSON-RPC error carrying its id.
#[tokio::test]
async fn a_request_that_finds_no_connection_gets_503() -> anyhow::Result<()> {
    let upstream = Counting::start().await?;
    let guard = Guard::start(&[
        "--upstream",
        &upstream.base(),
        "--max-upstream-connections",
        "2",
        "--upstream-queue-timeout",
        "300ms",
    ])
    .await?;
    let url = format!("{}/hold", guard.base);
    let held: Vec<_> = (1..=2u64)
        .map(|id| {
            let url = url.clone();
            tokio::spawn(async move { post_id(&url, id).await })
        })
        .collect();
    upstream.wait_arrivals(2).await?;
    let started = Instant::now();
    let (status, answer) = post_id(&url, 3).await?;
    let waited = started.elapsed();
    println!("third request with 2 busy connections: {status} after {waited:?}: {answer}");
    assert_eq!(status, 503);
    assert_eq!(answer["id"], 3);
    assert_eq!(answer["error"]["code"], -32000);
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    let _ = upstream.release.send(true);
    for call in held {
        assert_eq!(call.await??.0, 200);
    }
    Ok(())
}

/// Idle pooled connections are closed after `--pool-idle-timeout`: with a
/// long one (the old 90 s) two requests 600 ms apart share a connection;
/// with 200 ms the second needs a new one.
#[tokio::test]
async fn idle_pooled_connections_are_closed() -> anyhow::Result<()> {
    for (idle, expected) in [("90s", 1), ("200ms", 2)] {
        let upstream = Counting::start().await?;
        let guard =
            Guard::start(&["--upstream", &upstream.base(), "--pool-idle-timeout", idle]).await?;
        let url = format!("{}/now", guard.base);
        assert_eq!(post_id(&url, 1).await?.0, 200);
        // The pool's own timer is what is tested: wait past it.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(post_id(&url, 2).await?.0, 200);
        println!(
            "pool idle {idle}: {} upstream connection(s)",
            upstream.connections()
        );
        assert_eq!(upstream.connections(), expected, "pool idle {idle}");
    }
    Ok(())
}

/// Request heads: with the limit off (hyper's ~400 KiB, the old proxy) a
/// 100 KiB header reaches the upstream; with the default 32 KiB limit a
/// 40 KiB head gets `431` with a JSON-RPC error, a 100 KiB one `431` (or the
/// connection closed while it is still being sent), and a 20 KiB one passes.
#[tokio::test]
async fn oversized_request_heads_get_431() -> anyhow::Result<()> {
    let upstream = Counting::start().await?;
    let off = Guard::start(&["--upstream", &upstream.base(), "--max-header-bytes", "0"]).await?;
    let on = Guard::start(&["--upstream", &upstream.base()]).await?;
    let big = |kib: usize| "a".repeat(kib * 1024);
    let send = |url: String, value: String| async move {
        let request = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .header("x-padding", value)
            .body(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string());
        match tokio::time::timeout(OK_TIMEOUT, request.send()).await {
            Ok(Ok(response)) => {
                let status = response.status().as_u16();
                let body = response.text().await.unwrap_or_default();
                Ok((status, body))
            }
            Ok(Err(error)) => Err(format!("{error:#}")),
            Err(_) => Err("timed out".to_owned()),
        }
    };
    let control = send(format!("{}/now", off.base), big(100)).await;
    assert_eq!(
        control.as_ref().map(|answer| answer.0),
        Ok(200),
        "control: {control:?}"
    );

    let (status, body) = send(format!("{}/now", on.base), big(40))
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!(status, 431, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body)?["error"]["code"],
        -32600
    );
    let huge = send(format!("{}/now", on.base), big(100)).await;
    assert!(
        matches!(huge, Ok((431, _)) | Err(_)),
        "a 100 KiB head: {huge:?}"
    );
    let small = send(format!("{}/now", on.base), big(20)).await;
    assert_eq!(small.as_ref().map(|answer| answer.0), Ok(200), "{small:?}");
    println!("100 KiB head, limit off: 200; limit 32 KiB: 40 KiB -> 431 JSON, 100 KiB -> {:?}, 20 KiB -> 200",
        huge.map(|answer| answer.0));
    Ok(())
}

// ---------------------------------------------------------------------------
// Operating it: admin endpoints, metrics, logs
// ---------------------------------------------------------------------------

/// GETs `url`; returns the status and body.
pub(crate) async fn get(url: &str) -> anyhow::Result<(u16, String)> {
    let response = tokio::time::timeout(OK_TIMEOUT, reqwest::get(url)).await??;
    let status = response.status().as_u16();
    Ok((
        status,
        tokio::time::timeout(OK_TIMEOUT, response.text()).await??,
    ))
}

/// The admin address from the startup log.
pub(crate) async fn admin_base(guard: &Guard) -> anyhow::Result<String> {
    let lines = guard.wait_for_lines("admin endpoints on").await?;
    Ok(lines[0]
        .split("admin endpoints on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .context("no admin address")?
        .to_owned())
}

/// `--admin-listen` serves `/healthz`, `/readyz` and `/metrics` on its own
/// address (off by default): the guard's counters, answers by status,
/// refusals, connections and a latency histogram, in the Prometheus text
/// format.
#[tokio::test]
async fn admin_endpoints_report_health_and_metrics() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let plain = Guard::start(&["--upstream", &rmcp.base]).await?;
    let guard = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--admin-listen",
        "127.0.0.1:0",
        "--metrics-tool-names",
        "1",
    ])
    .await?;
    let admin = admin_base(&guard).await?;
    assert!(
        plain.lines_with("admin endpoints").is_empty(),
        "the admin listener is off by default"
    );
    assert_eq!(get(&format!("{admin}/healthz")).await?.0, 200);
    assert_eq!(get(&format!("{admin}/readyz")).await?.0, 200);
    assert_eq!(get(&format!("{admin}/nothing")).await?.0, 404);

    let session = Session::open(&guard.url()).await?;
    assert_eq!(duplicate_while_held(&rmcp, &session).await?, Outcome::Own);
    let (status, _) = post_with(&guard.url(), &REBOUND, &initialize()).await?;
    assert_eq!(status, 421);

    let (status, metrics) = get(&format!("{admin}/metrics")).await?;
    assert_eq!(status, 200);
    println!("{metrics}");
    for expected in [
        "mcp_id_guard_passed_total ",
        "mcp_id_guard_remapped_total 1",
        "mcp_id_guard_rejected_total 0",
        "mcp_id_guard_restored_total 1",
        "mcp_id_guard_in_flight_requests 0",
        "mcp_id_guard_tracked_sessions 0",
        "mcp_id_guard_abandoned_ids 0",
        "mcp_id_guard_client_connections ",
        "mcp_id_guard_responses_total{status=\"200\"}",
        "mcp_id_guard_responses_total{status=\"421\"} 1",
        "mcp_id_guard_refused_total{kind=\"host\"} 1",
        "mcp_id_guard_request_duration_seconds_bucket{le=",
        "mcp_id_guard_request_duration_seconds_count ",
        // By MCP method, the guard's decision and (--metrics-tool-names)
        // the tool.
        "mcp_id_guard_requests_total{mcp_method_name=\"tools/call\",decision=\"remapped\",gen_ai_tool_name=\"echo\"} 1\n",
        "mcp_server_operation_duration_seconds_count{mcp_method_name=\"tools/call\",decision=\"remapped\",gen_ai_tool_name=\"echo\"} 1\n",
        "mcp_id_guard_requests_total{mcp_method_name=\"notifications/initialized\",decision=\"passed\"} 1\n",
        "# EOF",
    ] {
        assert!(metrics.contains(expected), "{expected} missing");
    }
    Ok(())
}

/// An upstream that is down: `/readyz` answers 503, every request gets 502
/// and is counted by kind, and the warning is written once for 20 failures
/// (with the count on the next line), not once per request.
#[tokio::test]
async fn a_down_upstream_is_reported_not_flooded() -> anyhow::Result<()> {
    let refused = refused_port();
    let dead = format!("http://127.0.0.1:{}", refused.port);
    let guard = Guard::start(&["--upstream", &dead, "--admin-listen", "127.0.0.1:0"]).await?;
    let admin = admin_base(&guard).await?;
    assert_eq!(get(&format!("{admin}/readyz")).await?.0, 503);
    for id in 1..=20 {
        let (status, answer) = post_id(&guard.url(), id).await?;
        assert_eq!((status, &answer["id"]), (502, &json!(id)));
    }
    let (_, metrics) = get(&format!("{admin}/metrics")).await?;
    assert!(
        metrics.contains("mcp_id_guard_upstream_failures_total{kind=\"unreachable\"} 20"),
        "{metrics}"
    );
    assert!(metrics.contains("mcp_id_guard_responses_total{status=\"502\"} 20"));
    let warnings = guard.wait_for_lines("upstream request failed").await?;
    println!(
        "20 failed requests, {} warning line(s): {:?}",
        warnings.len(),
        warnings[0]
    );
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    Ok(())
}

/// `--log-format json` writes one JSON object per line.
#[tokio::test]
async fn json_logs() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = Guard::start(&["--upstream", &rmcp.base, "--log-format", "json"]).await?;
    let line = guard.wait_for_lines("listening on").await?.remove(0);
    let parsed: Value = serde_json::from_str(&line).with_context(|| line.clone())?;
    assert_eq!(parsed["level"], "INFO");
    assert!(parsed["fields"]["message"]
        .as_str()
        .is_some_and(|message| message.contains("listening on")));
    Session::open(&guard.url()).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Clients that do not read
// ---------------------------------------------------------------------------

/// Tells the test when a flood stream is dropped.
struct DropSignal(mpsc::UnboundedSender<()>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// An upstream whose every response streams 64 KiB chunks for ever (plain
/// text, or with `sse` SSE events of a progress notification); reports each
/// response's start and its end (the proxy dropped it).
async fn flood_upstream(
    sse: bool,
) -> anyhow::Result<(
    Served,
    mpsc::UnboundedReceiver<()>,
    mpsc::UnboundedReceiver<()>,
)> {
    use futures::StreamExt;
    let (started_tx, started) = mpsc::unbounded_channel();
    let (dropped_tx, dropped) = mpsc::unbounded_channel();
    let service = tower::service_fn(move |_request: http::Request<hyper::body::Incoming>| {
        let _ = started_tx.send(());
        let signal = DropSignal(dropped_tx.clone());
        let chunk = if sse {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": 1, "progress": 1, "message": "x".repeat(64 * 1024)}});
            bytes::Bytes::from(format!("data: {note}\n\n"))
        } else {
            bytes::Bytes::from(vec![b'x'; 64 * 1024])
        };
        let frames = futures::stream::unfold((signal, chunk), |(signal, chunk)| async move {
            let frame = http_body::Frame::data(chunk.clone());
            Some((Ok::<_, std::convert::Infallible>(frame), (signal, chunk)))
        })
        .boxed();
        let body = http_body_util::StreamBody::new(frames);
        async move {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .header(
                        "content-type",
                        if sse {
                            "text/event-stream"
                        } else {
                            "text/plain"
                        },
                    )
                    .body(body)
                    .unwrap(),
            )
        }
    });
    Ok((serve_service(service).await?, started, dropped))
}

/// A client that asks for a large response and never reads it: with no send
/// timeout (the old proxy) its upstream stream stays open for as long as the
/// client keeps the socket; with `--send-timeout 300ms` the connection is
/// dropped once writes stay blocked that long, and the upstream stream with it.
/// The other client limits are long (30 s), so the drop within 3 s shows the
/// watchdog acts on the blocked write itself, not at its next look after the
/// shortest of those limits. The same holds for a tracked POST answered with
/// an SSE stream: on HTTP/1.1 no per-response watcher runs, the watchdog's
/// blocked-write rule alone cuts it.
#[tokio::test]
async fn clients_that_do_not_read_are_dropped() -> anyhow::Result<()> {
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "t"}})
    .to_string();
    let tracked_sse = format!(
        "POST /flood HTTP/1.1\r\nHost: localhost\r\nAccept: {ACCEPT}\r\n\
         Content-Type: application/json\r\nMcp-Session-Id: s\r\n\
         Mcp-Protocol-Version: {PROTOCOL_VERSION}\r\nContent-Length: {}\r\n\r\n{call}",
        call.len()
    );
    let plain = "GET /flood HTTP/1.1\r\nHost: localhost\r\n\r\n".to_owned();
    for (sse, limit, dropped_expected) in [
        (false, "0", false),
        (false, "300ms", true),
        (true, "0", false),
        (true, "300ms", true),
    ] {
        let (upstream, mut started, mut dropped) = flood_upstream(sse).await?;
        let guard = Guard::start(&[
            "--upstream",
            &format!("http://{}", upstream.addr),
            "--send-timeout",
            limit,
            "--header-read-timeout",
            "30s",
            "--keep-alive-timeout",
            "30s",
        ])
        .await?;
        let mut client =
            tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
        let request = if sse { &tracked_sse } else { &plain };
        client.write_all(request.as_bytes()).await?;
        tokio::time::timeout(OK_TIMEOUT, started.recv())
            .await
            .context("the upstream stream did not start")?;
        let since = Instant::now();
        let within = if dropped_expected {
            OK_TIMEOUT
        } else {
            STAYS_OPEN
        };
        let ended = tokio::time::timeout(within, dropped.recv()).await.is_ok();
        println!(
            "sse {sse}, --send-timeout {limit}: upstream stream {} after {:?}",
            if ended { "dropped" } else { "still open" },
            since.elapsed()
        );
        assert_eq!(ended, dropped_expected, "sse {sse}, --send-timeout {limit}");
        if dropped_expected {
            assert!(
                since.elapsed() < Duration::from_secs(3),
                "{:?}",
                since.elapsed()
            );
        }
        drop(client);
    }
    Ok(())
}

/// An HTTP/2 (h2c) connection left idle after a request: open after 1.5 s
/// with no keep-alive limit (the old proxy), closed soon after 300 ms with
/// `--keep-alive-timeout 300ms`. Pings and settings the client's HTTP/2
/// stack sends do not count as a new request.
#[tokio::test]
async fn idle_http2_connections_are_closed() -> anyhow::Result<()> {
    for (limit, closes) in [("0", false), (SHORT, true)] {
        let guard = Guard::start(&[
            "--upstream",
            "http://127.0.0.1:9",
            "--keep-alive-timeout",
            limit,
        ])
        .await?;
        let stream = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
        let (mut sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await?;
        let connection = tokio::spawn(connection);
        // A refused Host: answered by the proxy itself, no upstream needed.
        let request = http::Request::get("http://evil.example/mcp")
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let response = tokio::time::timeout(OK_TIMEOUT, sender.send_request(request)).await??;
        assert_eq!(response.status(), 421);
        assert_eq!(response.version(), http::Version::HTTP_2);
        drop(response);
        let since = Instant::now();
        let within = if closes { OK_TIMEOUT } else { STAYS_OPEN };
        let ended = tokio::time::timeout(within, connection).await.is_ok();
        println!(
            "HTTP/2, --keep-alive-timeout {limit}: {} after {:?}",
            if ended { "closed" } else { "still open" },
            since.elapsed()
        );
        assert_eq!(ended, closes, "--keep-alive-timeout {limit}");
        if closes {
            assert!(since.elapsed() >= Duration::from_millis(250));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Issue 21: stalled HTTP/2 streams, shutdown, the connection gauge, targets
// ---------------------------------------------------------------------------

/// The metrics text from the admin address.
async fn metrics(admin: &str) -> anyhow::Result<String> {
    let (status, text) = get(&format!("{admin}/metrics")).await?;
    anyhow::ensure!(status == 200, "/metrics answered {status}");
    Ok(text)
}

/// The `mcp_id_guard_client_connections` gauge.
async fn client_connections(admin: &str) -> anyhow::Result<String> {
    let text = metrics(admin).await?;
    text.lines()
        .find_map(|line| line.strip_prefix("mcp_id_guard_client_connections "))
        .map(str::to_owned)
        .context("no client_connections gauge")
}

/// Waits (bounded) until the gauge reads `expected`.
async fn wait_client_connections(admin: &str, expected: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + OK_TIMEOUT;
    loop {
        let open = client_connections(admin).await?;
        if open == expected {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "client_connections stayed {open}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An HTTP/2 client that sets `INITIAL_WINDOW_SIZE` 20, opens a stream from
/// an upstream that streams for ever, and reads its socket but never opens
/// the stream's window: the socket never blocks, so only a per-response
/// rule sees it. With `--send-timeout 300ms` and one upstream connection,
/// the stream is ended within a bounded time, its upstream response
/// dropped, and the next request gets the connection (not 503).
#[tokio::test]
async fn stalled_http2_streams_free_their_upstream_connection() -> anyhow::Result<()> {
    let (upstream, mut started, mut dropped) = flood_upstream(false).await?;
    let guard = Guard::start(&[
        "--upstream",
        &format!("http://{}", upstream.addr),
        "--send-timeout",
        "300ms",
        "--max-upstream-connections",
        "1",
        "--upstream-queue-timeout",
        "300ms",
        "--header-read-timeout",
        "30s",
        "--keep-alive-timeout",
        "30s",
    ])
    .await?;
    let tcp = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
    let (mut client, connection) = tokio::time::timeout(
        OK_TIMEOUT,
        h2::client::Builder::new()
            .initial_window_size(20)
            .handshake::<_, bytes::Bytes>(tcp),
    )
    .await??;
    // The connection task keeps reading the socket.
    let connection = tokio::spawn(connection);
    let request = http::Request::get(format!("http://{}/flood", guard.addr)).body(())?;
    let (response, _) = client.send_request(request, true)?;
    let response = tokio::time::timeout(OK_TIMEOUT, response).await??;
    assert_eq!(response.status(), 200);
    tokio::time::timeout(OK_TIMEOUT, started.recv())
        .await
        .context("the upstream stream did not start")?;
    let mut body = response.into_body();
    let since = Instant::now();
    // Whatever the window lets through is read; capacity is never released.
    let ended = tokio::time::timeout(OK_TIMEOUT, async {
        let mut received = 0;
        loop {
            match body.data().await {
                Some(Ok(data)) => received += data.len(),
                Some(Err(error)) => return (received, Some(error)),
                None => return (received, None),
            }
        }
    })
    .await;
    println!("stalled stream: {ended:?} after {:?}", since.elapsed());
    let (received, error) = ended
        .map_err(|_| anyhow::anyhow!("the stalled stream was still open after {OK_TIMEOUT:?}"))?;
    assert!(received <= 20, "{received} bytes through a 20-byte window");
    assert!(error.is_some(), "the stalled stream ended cleanly");
    assert!(
        since.elapsed() < Duration::from_secs(3),
        "{:?}",
        since.elapsed()
    );
    tokio::time::timeout(OK_TIMEOUT, dropped.recv())
        .await
        .context("the upstream response was not dropped")?;
    connection.abort();

    // The one upstream connection serves the next request.
    let mut next = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
    next.write_all(b"GET /flood HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut status_line = [0u8; 12];
    tokio::time::timeout(OK_TIMEOUT, next.read_exact(&mut status_line)).await??;
    assert_eq!(&status_line, b"HTTP/1.1 200", "the next request");
    Ok(())
}

/// The gauge of client connections counts clients only: 0 with none
/// connected (the accept loop waiting for one holds no connection), 1 with
/// one, 0 again once it is gone.
#[tokio::test]
async fn client_connections_gauge_counts_clients_only() -> anyhow::Result<()> {
    let guard = Guard::start(&[
        "--upstream",
        "http://127.0.0.1:9",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .await?;
    let admin = admin_base(&guard).await?;
    assert_eq!(
        client_connections(&admin).await?,
        "0",
        "no client connected"
    );
    let mut client = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
    client.write_all(b"GE").await?;
    wait_client_connections(&admin, "1").await?;
    drop(client);
    wait_client_connections(&admin, "0").await?;
    Ok(())
}

/// After SIGTERM the head limit still applies: a connection that sent `GE`
/// and one that sent the HTTP/2 preface and SETTINGS (and never answers the
/// GOAWAY ping) are cut after `--header-read-timeout`, so the process exits
/// long before its 20 s grace period.
#[tokio::test]
async fn sigterm_still_cuts_unfinished_heads() -> anyhow::Result<()> {
    let mut guard = Guard::start(&[
        "--upstream",
        "http://127.0.0.1:9",
        "--grace-period",
        "20s",
        "--header-read-timeout",
        SHORT,
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .await?;
    let admin = admin_base(&guard).await?;
    let mut half = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
    half.write_all(b"GE").await?;
    let mut preface = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
    // The preface, then an empty SETTINGS frame.
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await?;
    wait_client_connections(&admin, "2").await?;
    let since = Instant::now();
    guard.sigterm()?;
    let status = guard.wait_exit(OK_TIMEOUT).await?;
    println!("exited {status} {:?} after SIGTERM", since.elapsed());
    assert!(status.success(), "{status}");
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "{:?}",
        since.elapsed()
    );
    drop((half, preface));
    Ok(())
}

/// Sends `raw` on a new connection; returns the response's status code.
async fn raw_status(addr: &str, raw: &str) -> anyhow::Result<u16> {
    let mut stream = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(addr)).await??;
    stream.write_all(raw.as_bytes()).await?;
    let mut line = [0u8; 12];
    tokio::time::timeout(OK_TIMEOUT, stream.read_exact(&mut line)).await??;
    let text = std::str::from_utf8(&line)?;
    text.strip_prefix("HTTP/1.1 ")
        .context("no status line")?
        .parse()
        .with_context(|| format!("status line {text:?}"))
}

/// Targets that could leave the upstream's prefix or name another target
/// than the one the Host policy checked get 400 and never reach the
/// upstream: dot segments (plain or percent-encoded), and, under
/// `--preserve-host`, a `Host` header that differs from an absolute-form
/// target's or HTTP/2 `:authority`. `CONNECT` never gets that far (`405`).
#[tokio::test]
async fn escaping_and_mismatched_targets_get_400() -> anyhow::Result<()> {
    let (upstream, mut started, _dropped) = flood_upstream(false).await?;
    let guard = Guard::start(&[
        "--upstream",
        &format!("http://{}/mcp", upstream.addr),
        "--preserve-host",
    ])
    .await?;
    let addr = guard.addr.clone();
    let ok = format!("GET /x HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    assert_eq!(raw_status(&addr, &ok).await?, 200, "a plain target");
    tokio::time::timeout(OK_TIMEOUT, started.recv()).await?;
    for target in [
        "/../admin",
        "/x/../../admin",
        "/%2e%2e/admin",
        "/%2E%2E/admin",
        "/.%2e/admin",
        "/..%2fadmin",
    ] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        assert_eq!(raw_status(&addr, &raw).await?, 400, "{target}");
    }
    let connect = format!("CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    // Answered before the target is looked at: no tunnel here.
    assert_eq!(raw_status(&addr, &connect).await?, 405, "CONNECT");
    // The policy checks the absolute-form target's authority (a loopback
    // name); the Host header names another host.
    let mismatched = format!("GET http://{addr}/x HTTP/1.1\r\nHost: evil.example\r\n\r\n");
    assert_eq!(raw_status(&addr, &mismatched).await?, 400, "Host differs");
    let matching = format!("GET http://{addr}/x HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    assert_eq!(raw_status(&addr, &matching).await?, 200, "Host matches");
    tokio::time::timeout(OK_TIMEOUT, started.recv()).await?;

    // HTTP/2: `:authority` checked, a `Host` header naming another host.
    let tcp = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&addr)).await??;
    let (client, connection) =
        tokio::time::timeout(OK_TIMEOUT, h2::client::handshake(tcp)).await??;
    let connection = tokio::spawn(connection);
    let mut client = tokio::time::timeout(OK_TIMEOUT, client.ready()).await??;
    let request = http::Request::get(format!("http://{addr}/x"))
        .header("host", "evil.example")
        .body(())?;
    let (response, _) = client.send_request(request, true)?;
    let response = tokio::time::timeout(OK_TIMEOUT, response).await??;
    assert_eq!(
        response.status(),
        400,
        "HTTP/2 Host differs from :authority"
    );
    connection.abort();
    assert!(
        started.try_recv().is_err(),
        "a refused request reached the upstream"
    );
    Ok(())
}
