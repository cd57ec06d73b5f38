//! One client connection cannot flood the upstream (issue 21 §1): an HTTP/2
//! client that sends complete `tools/call` requests in batches and resets
//! each stream shortly after, and an HTTP/1.1 client that pipelines
//! requests on one keep-alive connection. hyper's own limit only counts
//! resets of streams it has not accepted yet; these streams were accepted
//! and forwarded. With the per-connection request cap (default 1000) the
//! upstream sees at most the cap; with the HTTP/2 reset budget a connection
//! whose streams are reset before their response is closed with a GOAWAY;
//! with both off (the old proxy) the upstream gets the whole flood.
//!
//! The settings go through their environment variables: a binary without
//! them ignores those and shows the flood on the very assertions that fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::hardening::{admin_base, get};
use crate::support::process::Guard;
use crate::support::server::{serve_service, Served};
use crate::support::{ACCEPT, OK_TIMEOUT, PROTOCOL_VERSION};

/// Streams the attack opens before it stops.
const STREAMS: usize = 3000;
/// Or until this much time has passed.
const FLOOD_FOR: Duration = Duration::from_secs(10);
/// Streams sent at once before they are reset: not a divisor of the cap, so
/// that streams past it are sent before the GOAWAY can arrive (hyper's
/// limit of concurrent streams is 200).
const BATCH: usize = 150;
/// The default --max-requests-per-connection.
const CAP: usize = 1000;
/// The default --max-client-resets.
const RESETS: usize = 250;

/// An upstream that counts the requests reaching it and answers each with
/// its own id at once, except on `/hold`, where it never answers.
struct Recording {
    served: Served,
    arrived: Arc<watch::Sender<usize>>,
}

impl Recording {
    async fn start() -> anyhow::Result<Self> {
        let arrived = Arc::new(watch::Sender::new(0));
        let count = Arc::clone(&arrived);
        let service = tower::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            count.send_modify(|count| *count += 1);
            async move {
                if request.uri().path() == "/hold" {
                    std::future::pending::<()>().await;
                }
                use http_body_util::BodyExt;
                let body = request.into_body().collect().await.map(|b| b.to_bytes());
                let id = body
                    .ok()
                    .and_then(|body| serde_json::from_slice::<Value>(&body).ok())
                    .map_or(Value::Null, |message| message["id"].clone());
                let answer = json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string();
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header("content-type", "application/json")
                        .body(http_body_util::Full::new(Bytes::from(answer)))
                        .unwrap(),
                )
            }
        });
        Ok(Self {
            served: serve_service(service).await?,
            arrived,
        })
    }

    fn base(&self) -> String {
        format!("http://{}", self.served.addr)
    }

    /// The requests that reached it, once no more arrive: the count must
    /// stay the same for 300 ms (bounded by `OK_TIMEOUT`).
    async fn settled(&self) -> usize {
        let deadline = Instant::now() + OK_TIMEOUT;
        let mut last = *self.arrived.borrow();
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = *self.arrived.borrow();
            if now == last || Instant::now() > deadline {
                return now;
            }
            last = now;
        }
    }
}

/// What the attacking connection saw.
#[derive(Debug)]
struct Flood {
    /// Streams opened (requests sent whole).
    sent: usize,
    /// Streams the proxy refused (REFUSED_STREAM).
    refused: usize,
    /// The proxy's GOAWAY stopped the flood.
    go_away: bool,
    /// What stopped it (the GOAWAY, or another error).
    error: Option<String>,
}

/// When the attack resets a batch's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResetWhen {
    /// Once each was answered: the requests completed, then were reset.
    Answered,
    /// Once each was forwarded to the upstream (or answered by the proxy):
    /// before its response.
    Forwarded,
}

/// One h2c (prior knowledge) connection to `addr` that sends complete
/// `tools/call` POSTs to `path` in batches of [`BATCH`] and resets each
/// stream of a batch once they are all answered or forwarded (`when`),
/// until [`STREAMS`] streams, [`FLOOD_FOR`], or the proxy's GOAWAY. Streams
/// are reset only once hyper has accepted them (it has called the proxy's
/// service): hyper's own limit on resets of streams it has not accepted
/// yet, which closes the classic rapid reset, never sees them.
async fn reset_flood(
    upstream: &Recording,
    addr: &str,
    path: &str,
    when: ResetWhen,
) -> anyhow::Result<Flood> {
    use futures::StreamExt;
    let started = Instant::now();
    let tcp = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(addr)).await??;
    let (mut client, connection) =
        tokio::time::timeout(OK_TIMEOUT, h2::client::handshake(tcp)).await??;
    let connection = tokio::spawn(connection);
    let uri = format!("http://{addr}{path}");
    let mut sent = 0;
    let mut refused = 0;
    let mut stopped: Option<h2::Error> = None;
    'flood: while sent < STREAMS && started.elapsed() < FLOOD_FOR {
        let mut batch = Vec::with_capacity(BATCH);
        let mut responses = futures::stream::FuturesUnordered::new();
        let mut arrivals = upstream.arrived.subscribe();
        let before = *arrivals.borrow_and_update();
        for _ in 0..BATCH {
            client = match tokio::time::timeout(OK_TIMEOUT, client.clone().ready()).await {
                Err(_) => anyhow::bail!("no stream capacity within {OK_TIMEOUT:?}"),
                Ok(Err(error)) => {
                    stopped = Some(error);
                    break 'flood;
                }
                Ok(Ok(client)) => client,
            };
            let request = http::Request::post(&uri)
                .header("content-type", "application/json")
                .header("accept", ACCEPT)
                .header("mcp-protocol-version", PROTOCOL_VERSION)
                .body(())?;
            let body = json!({
                "jsonrpc": "2.0", "id": sent, "method": "tools/call",
                "params": { "name": "echo", "arguments": {} }
            })
            .to_string();
            let sending = client
                .send_request(request, false)
                .and_then(|(response, mut stream)| {
                    stream.send_data(Bytes::from(body), true)?;
                    Ok((response, stream))
                });
            match sending {
                Ok((response, stream)) => {
                    batch.push(stream);
                    responses.push(response);
                }
                Err(error) => {
                    stopped = Some(error);
                    break 'flood;
                }
            }
            sent += 1;
        }
        let accepted = async {
            let mut answered = 0;
            loop {
                let forwarded = match when {
                    ResetWhen::Answered => 0,
                    ResetWhen::Forwarded => *arrivals.borrow_and_update() - before,
                };
                if answered + forwarded >= batch.len() {
                    return;
                }
                tokio::select! {
                    Some(response) = responses.next() => {
                        answered += 1;
                        if let Err(error) = response {
                            if error.reason() == Some(h2::Reason::REFUSED_STREAM) {
                                refused += 1;
                            }
                        }
                    }
                    Ok(()) = arrivals.changed() => {}
                }
            }
        };
        tokio::time::timeout(OK_TIMEOUT, accepted)
            .await
            .context("the batch was neither answered nor forwarded")?;
        for mut stream in batch {
            stream.send_reset(h2::Reason::CANCEL);
        }
    }
    drop(client);
    // The connection's own end: after a GOAWAY it finishes (or is cut).
    let ended = tokio::time::timeout(OK_TIMEOUT, connection).await;
    let go_away = stopped
        .as_ref()
        .is_some_and(|error| error.is_go_away() && error.is_remote());
    let error = stopped.map(|error| format!("{error}; connection ended: {ended:?}"));
    Ok(Flood {
        sent,
        refused,
        go_away,
        error,
    })
}

/// The attack against the defaults: complete requests, each stream
/// reset once its batch is answered (so no reset is premature). The
/// upstream sees at most the default cap of 1000 and a GOAWAY ends the flood
/// (the old proxy: all 3000 streams reach the upstream, no GOAWAY). The
/// control with both limits off shows the flood.
#[tokio::test]
async fn reset_flood_stops_at_the_request_cap() -> anyhow::Result<()> {
    let off = [
        ("MCP_ID_GUARD_MAX_REQUESTS_PER_CONNECTION", "0"),
        ("MCP_ID_GUARD_MAX_CLIENT_RESETS", "0"),
    ];
    for (what, env) in [("defaults", &[][..]), ("limits off", &off[..])] {
        let upstream = Recording::start().await?;
        let guard = Guard::start_env(
            &[
                "--upstream",
                &upstream.base(),
                "--admin-listen",
                "127.0.0.1:0",
            ],
            env,
        )
        .await?;
        let started = Instant::now();
        let flood = reset_flood(&upstream, &guard.addr, "/mcp", ResetWhen::Answered).await?;
        let took = started.elapsed();
        let reached = upstream.settled().await;
        println!("{what}: {flood:?} in {took:?}; {reached} requests reached the upstream");
        if env.is_empty() {
            // Exactly the requests counted up to the cap may be forwarded;
            // those after it are answered by the proxy. No slack needed.
            assert!(
                reached <= CAP,
                "{what}: {reached} requests reached the upstream"
            );
            assert!(flood.go_away, "{what}: no GOAWAY: {flood:?}");
            assert!(flood.sent < STREAMS, "{what}: {flood:?}");
            let (_, metrics) = get(&format!("{}/metrics", admin_base(&guard).await?)).await?;
            assert!(
                metrics.contains("mcp_id_guard_connections_closed_total{reason=\"request_cap\"} 1"),
                "{metrics}"
            );
            // Streams past the cap, sent before the GOAWAY arrived, were
            // refused (retryable), not forwarded.
            if flood.refused > 0 {
                let line = format!(
                    "mcp_id_guard_refused_total{{kind=\"connection_closing\"}} {}",
                    flood.refused
                );
                assert!(metrics.contains(&line), "{line} missing: {metrics}");
            }
        } else {
            assert!(!flood.go_away, "{what}: {flood:?}");
            assert_eq!(flood.error, None, "{what}");
            assert!(
                reached >= 2 * CAP,
                "{what}: only {reached} reached the upstream"
            );
        }
    }
    Ok(())
}

/// Streams reset before their response (the upstream holds every call): with
/// the request cap off, the default reset budget (250 per minute, at least
/// half the streams) closes the connection with a GOAWAY. The upstream sees
/// at most the budget plus two batches: the batch whose resets cross the
/// budget was forwarded whole before they arrived, and a reset is counted
/// only when the stream's own task notices it and drops the request, while
/// the connection's task may meanwhile hand the next batch (sent right after
/// the resets) to the proxy (seen: 250 resets counted with 393 streams in).
/// With the budget off too (the old proxy) all 3000 reach the upstream.
#[tokio::test]
async fn premature_resets_close_the_connection() -> anyhow::Result<()> {
    for resets in ["250", "0"] {
        let upstream = Recording::start().await?;
        let guard = Guard::start_env(
            &[
                "--upstream",
                &upstream.base(),
                "--admin-listen",
                "127.0.0.1:0",
            ],
            &[
                ("MCP_ID_GUARD_MAX_REQUESTS_PER_CONNECTION", "0"),
                ("MCP_ID_GUARD_MAX_CLIENT_RESETS", resets),
            ],
        )
        .await?;
        let started = Instant::now();
        let flood = reset_flood(&upstream, &guard.addr, "/hold", ResetWhen::Forwarded).await?;
        let took = started.elapsed();
        let reached = upstream.settled().await;
        println!(
            "--max-client-resets {resets}: {flood:?} in {took:?}; {reached} requests reached the upstream"
        );
        if resets == "0" {
            assert!(!flood.go_away, "{flood:?}");
            assert!(reached >= 2 * CAP, "only {reached} reached the upstream");
            continue;
        }
        assert!(flood.go_away, "no GOAWAY: {flood:?}");
        assert!(
            reached <= RESETS + 2 * BATCH,
            "{reached} requests reached the upstream"
        );
        let (_, metrics) = get(&format!("{}/metrics", admin_base(&guard).await?)).await?;
        assert!(
            metrics.contains("mcp_id_guard_connections_closed_total{reason=\"client_resets\"} 1"),
            "{metrics}"
        );
        let counted = metrics
            .lines()
            .find_map(|line| line.strip_prefix("mcp_id_guard_client_resets_total "))
            .and_then(|count| count.trim().parse::<usize>().ok())
            .context("no mcp_id_guard_client_resets_total")?;
        assert!(counted >= RESETS, "{counted} resets counted");
    }
    Ok(())
}

/// A normal HTTP/2 client is not taken for an attacker: 300 calls on one
/// connection, each read to its end, count no reset (their bodies ended
/// before hyper dropped them), whatever the default budget.
#[tokio::test]
async fn completed_streams_are_not_counted_as_resets() -> anyhow::Result<()> {
    let upstream = Recording::start().await?;
    let guard = Guard::start(&[
        "--upstream",
        &upstream.base(),
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .await?;
    let tcp = tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
    let (client, connection) =
        tokio::time::timeout(OK_TIMEOUT, h2::client::handshake(tcp)).await??;
    tokio::spawn(connection);
    let call = |id: usize| {
        let client = client.clone();
        let uri = format!("http://{}/mcp", guard.addr);
        async move {
            let mut client = client.ready().await?;
            let request = http::Request::post(uri)
                .header("content-type", "application/json")
                .header("accept", ACCEPT)
                .body(())?;
            let (response, mut stream) = client.send_request(request, false)?;
            let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {}});
            stream.send_data(Bytes::from(body.to_string()), true)?;
            let mut body = response.await?.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            anyhow::Ok(())
        }
    };
    // One call first: the client then knows the proxy's stream limit (200),
    // and queues the others instead of opening streams the proxy refuses.
    tokio::time::timeout(OK_TIMEOUT, call(0)).await??;
    let calls = (1..300).map(call);
    tokio::time::timeout(OK_TIMEOUT, futures::future::try_join_all(calls)).await??;
    let (_, metrics) = get(&format!("{}/metrics", admin_base(&guard).await?)).await?;
    assert!(
        metrics.contains("mcp_id_guard_client_resets_total 0"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("mcp_id_guard_connections_closed_total{"),
        "{metrics}"
    );
    Ok(())
}

/// HTTP/1.1 keep-alive stops at the cap too: five requests pipelined on one
/// connection with a cap of 3 get three responses, the third with
/// `Connection: close`, then the connection closes, and the upstream sees
/// three. With the cap off (the old proxy) all five are answered on the
/// still-open connection.
#[tokio::test]
async fn http1_keep_alive_stops_at_the_request_cap() -> anyhow::Result<()> {
    for cap in ["3", "0"] {
        let upstream = Recording::start().await?;
        let guard = Guard::start_env(
            &["--upstream", &upstream.base()],
            &[("MCP_ID_GUARD_MAX_REQUESTS_PER_CONNECTION", cap)],
        )
        .await?;
        let mut client =
            tokio::time::timeout(OK_TIMEOUT, TcpStream::connect(&guard.addr)).await??;
        let mut requests = String::new();
        for id in 1..=5 {
            let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {}})
                .to_string();
            requests.push_str(&format!(
                "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: {ACCEPT}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ));
        }
        client.write_all(requests.as_bytes()).await?;
        // Reads until the connection closes or five responses are in.
        let mut received = Vec::new();
        let closed = tokio::time::timeout(OK_TIMEOUT, async {
            let mut buffer = [0u8; 4096];
            loop {
                match client.read(&mut buffer).await {
                    Ok(0) | Err(_) => return true,
                    Ok(n) => received.extend_from_slice(&buffer[..n]),
                }
                if String::from_utf8_lossy(&received)
                    .matches("HTTP/1.1 200")
                    .count()
                    == 5
                {
                    return false;
                }
            }
        })
        .await
        .context("neither closed nor five responses")?;
        let text = String::from_utf8_lossy(&received).to_lowercase();
        let responses: Vec<&str> = text.split("http/1.1 ").skip(1).collect();
        let reached = upstream.settled().await;
        println!(
            "cap {cap}: {} responses, connection {}; {reached} requests reached the upstream",
            responses.len(),
            if closed { "closed" } else { "open" },
        );
        if cap == "3" {
            assert_eq!(responses.len(), 3, "{text}");
            assert!(closed, "the connection stayed open");
            assert!(responses[2].contains("connection: close"), "{text}");
            assert!(!responses[1].contains("connection: close"), "{text}");
            assert_eq!(reached, 3);
        } else {
            assert_eq!(responses.len(), 5, "{text}");
            assert!(!closed);
            assert_eq!(reached, 5);
        }
    }
    Ok(())
}
