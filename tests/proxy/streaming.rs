//! SSE through the proxy is not buffered: behind a slow upstream that sends an
//! event every 300 ms, the client has the first event before the upstream has
//! even sent the last one. The proof is a flag the upstream sets when it sends
//! its last event, not timing; the 300 ms gaps are the scenario.
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcp_id_guard::IdGuardLayer;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::server::{serve_proxy, serve_service, Served};
use crate::support::sse::{self, first_event};
use crate::support::wait::drained;
use crate::support::OK_TIMEOUT;

const EVENTS: usize = 5;
const GAP: Duration = Duration::from_millis(300);

type SseBody = StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// An upstream that answers every request with an SSE stream of [`EVENTS`]
/// events, [`GAP`] apart. For a POST, the last event is the JSON-RPC response
/// to the request's id. `last_sent` is set as the last event is sent.
async fn slow_sse_upstream(last_sent: Arc<AtomicBool>) -> anyhow::Result<Served> {
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let last_sent = Arc::clone(&last_sent);
        async move {
            let body = request.into_body().collect().await;
            let id = body
                .ok()
                .and_then(|body| serde_json::from_slice::<Value>(&body.to_bytes()).ok())
                .map(|message| message["id"].clone())
                .unwrap_or(Value::Null);
            let (tx, mut rx) = mpsc::channel::<Bytes>(1);
            tokio::spawn(async move {
                for n in 1..=EVENTS {
                    let data = if n == EVENTS {
                        json!({"jsonrpc": "2.0", "id": id, "result": {"events": EVENTS}})
                    } else {
                        json!({"jsonrpc": "2.0", "method": "notifications/progress",
                               "params": {"progress": n}})
                    };
                    if n == EVENTS {
                        last_sent.store(true, Ordering::SeqCst);
                    }
                    let event = format!("id: {n}\ndata: {data}\n\n");
                    if tx.send(Bytes::from(event)).await.is_err() {
                        return;
                    }
                    if n < EVENTS {
                        // The scenario: a slow server, not synchronisation.
                        tokio::time::sleep(GAP).await;
                    }
                }
            });
            let stream = futures::stream::poll_fn(move |cx| {
                rx.poll_recv(cx)
                    .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
            });
            let body: SseBody = StreamBody::new(Box::pin(stream));
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .header("cache-control", "no-cache")
                    .body(body)
                    .unwrap(),
            )
        }
    });
    serve_service(service).await
}

/// Reads the rest of an SSE response and returns the data of every event.
async fn all_events(
    first: String,
    response: &mut reqwest::Response,
) -> anyhow::Result<Vec<String>> {
    let mut text = first;
    while let Some(chunk) = tokio::time::timeout(OK_TIMEOUT, response.chunk()).await?? {
        text.push_str(std::str::from_utf8(&chunk)?);
    }
    Ok(sse::data(&text))
}

/// GET (a standalone stream, untracked by the guard) over HTTP/1.1.
#[tokio::test]
async fn get_stream_events_arrive_before_the_upstream_finishes() -> anyhow::Result<()> {
    let last_sent = Arc::new(AtomicBool::new(false));
    let upstream = slow_sse_upstream(Arc::clone(&last_sent)).await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let client = reqwest::Client::new();

    let started = Instant::now();
    let mut response = tokio::time::timeout(
        OK_TIMEOUT,
        client
            .get(format!("http://{}/mcp", proxy.addr))
            .header("accept", "text/event-stream")
            .header("mcp-session-id", "s")
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let first = tokio::time::timeout(OK_TIMEOUT, first_event(&mut response)).await??;
    let latency = started.elapsed();
    assert!(
        !last_sent.load(Ordering::SeqCst),
        "the first event arrived only after the upstream sent its last"
    );
    println!("GET via proxy: first event after {latency:?}");
    let events = all_events(first, &mut response).await?;
    assert_eq!(events.len(), EVENTS);
    assert!(last_sent.load(Ordering::SeqCst));

    // Baseline: the same stream straight from the upstream.
    last_sent.store(false, Ordering::SeqCst);
    let started = Instant::now();
    let mut direct = client
        .get(format!("http://{}/mcp", upstream.addr))
        .header("accept", "text/event-stream")
        .send()
        .await?;
    tokio::time::timeout(OK_TIMEOUT, first_event(&mut direct)).await??;
    println!("GET direct:    first event after {:?}", started.elapsed());
    Ok(())
}

/// A tracked POST whose id the guard remaps (a client id in the guard's
/// namespace always is): the SSE rewriter restores the id in the final event
/// and still passes every event on as it comes.
#[tokio::test]
async fn remapped_post_stream_is_not_buffered() -> anyhow::Result<()> {
    let last_sent = Arc::new(AtomicBool::new(false));
    let upstream = slow_sse_upstream(Arc::clone(&last_sent)).await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let id = "mcp-id-guard:client-chosen";

    let started = Instant::now();
    let mut response = tokio::time::timeout(
        OK_TIMEOUT,
        reqwest::Client::new()
            .post(format!("http://{}/mcp", proxy.addr))
            .header("accept", crate::support::ACCEPT)
            .header("content-type", "application/json")
            .header("mcp-session-id", "s")
            .body(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call"}).to_string())
            .send(),
    )
    .await??;
    let first = tokio::time::timeout(OK_TIMEOUT, first_event(&mut response)).await??;
    let latency = started.elapsed();
    assert!(!last_sent.load(Ordering::SeqCst));
    assert_eq!(guard.stats().in_flight_requests, 1);
    println!("remapped POST via proxy: first event after {latency:?}");
    let events = all_events(first, &mut response).await?;
    assert_eq!(events.len(), EVENTS);
    let last: Value = serde_json::from_str(&events[EVENTS - 1])?;
    assert_eq!(last["id"], id, "the client's id is restored");
    let stats = drained(&guard).await?;
    assert_eq!(stats.remapped_total, 1);
    Ok(())
}

/// The same over h2c (HTTP/2 with prior knowledge) from the client; the
/// proxy still talks HTTP/1.1 to the upstream.
#[tokio::test]
async fn h2c_client_gets_events_as_they_come() -> anyhow::Result<()> {
    let last_sent = Arc::new(AtomicBool::new(false));
    let upstream = slow_sse_upstream(Arc::clone(&last_sent)).await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();

    let started = Instant::now();
    let response = tokio::time::timeout(
        OK_TIMEOUT,
        client.request(
            Request::get(format!("http://{}/mcp", proxy.addr))
                .header("accept", "text/event-stream")
                .body(Empty::new())?,
        ),
    )
    .await??;
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut text = String::new();
    let mut first_latency = None;
    while let Some(frame) = tokio::time::timeout(OK_TIMEOUT, body.frame()).await? {
        if let Ok(data) = frame?.into_data() {
            text.push_str(std::str::from_utf8(&data)?);
        }
        if first_latency.is_none() && !sse::events(&text).is_empty() {
            first_latency = Some(started.elapsed());
            assert!(!last_sent.load(Ordering::SeqCst));
        }
    }
    println!(
        "GET via proxy over h2c: first event after {:?}",
        first_latency.expect("an event")
    );
    assert_eq!(sse::data(&text).len(), EVENTS);
    Ok(())
}

/// A socket that counts the writes that moved bytes (each one a round
/// through the TCP stack and a wake-up of the peer).
struct CountedWrites {
    stream: tokio::net::TcpStream,
    writes: Arc<std::sync::atomic::AtomicUsize>,
}

impl CountedWrites {
    fn count<T>(&self, written: &std::task::Poll<std::io::Result<usize>>, _: T) {
        if matches!(written, std::task::Poll::Ready(Ok(n)) if *n > 0) {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl tokio::io::AsyncRead for CountedWrites {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for CountedWrites {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let written = std::pin::Pin::new(&mut self.stream).poll_write(cx, buf);
        self.count(&written, ());
        written
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let written = std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.count(&written, ());
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Reads from `socket` until `buffer` holds `end`.
async fn read_until(
    socket: &mut tokio::net::TcpStream,
    buffer: &mut Vec<u8>,
    end: &[u8],
) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    while !buffer.windows(end.len()).any(|window| window == end) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(OK_TIMEOUT, socket.read(&mut chunk)).await??;
        anyhow::ensure!(
            n > 0,
            "connection closed before {:?}",
            String::from_utf8_lossy(end)
        );
        buffer.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

/// An upstream for one request: once the request (whose body ends with
/// `"method":"tools/call"}`) is in, it writes `whole(id)` in one write, `id`
/// being the request's id as it arrived, then keeps the connection open, or
/// closes it when `then_close`.
async fn one_write_upstream(
    whole: impl FnOnce(&str) -> String + Send + 'static,
    then_close: bool,
) -> anyhow::Result<(
    std::net::SocketAddr,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    use tokio::io::AsyncWriteExt;
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = upstream.local_addr()?;
    let task = tokio::spawn(async move {
        let (mut socket, _) = upstream.accept().await?;
        let mut request = Vec::new();
        read_until(&mut socket, &mut request, b"\"method\":\"tools/call\"}").await?;
        let request = String::from_utf8(request)?;
        let id = request
            .split("\"id\":")
            .nth(1)
            .and_then(|rest| rest.split(",\"method\"").next())
            .unwrap_or("null");
        socket.write_all(whole(id).as_bytes()).await?;
        if !then_close {
            // Open, as a pooled upstream connection is.
            let _ = read_until(&mut socket, &mut Vec::new(), b"never").await;
        }
        anyhow::Ok(())
    });
    Ok((addr, task))
}

/// Serves the guarded proxy to `upstream` on one connection whose writes are
/// counted; sends it a `tools/call` with `id` (JSON text) in session `s` and
/// returns the client socket, the write count and the guard.
async fn counted_exchange(
    upstream: std::net::SocketAddr,
    id: &str,
) -> anyhow::Result<(
    tokio::net::TcpStream,
    Arc<std::sync::atomic::AtomicUsize>,
    IdGuardLayer,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    use tokio::io::AsyncWriteExt;
    let guard = IdGuardLayer::new();
    let proxy = mcp_id_guard::proxy::Proxy::new(&format!("http://{upstream}"))?;
    let service = tower::Layer::layer(&guard, proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let proxy_addr = listener.local_addr()?;
    let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&writes);
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await?;
        let io = CountedWrites {
            stream,
            writes: counted,
        };
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let mut service = service.clone();
            tower::Service::call(&mut service, request)
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .await?;
        anyhow::Ok(())
    });
    let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call"}}"#);
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-session-id: s\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut client = tokio::net::TcpStream::connect(proxy_addr).await?;
    client.write_all(request.as_bytes()).await?;
    Ok((client, writes, guard, server))
}

const PRIMING: &str = "data: \nid: 0/0\nretry: 3000\n\n";
const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// The response event to `id`.
fn answer(id: &str) -> String {
    format!("data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[]}}}}\nid: 1/0\n\n")
}

/// The body of a whole chunked HTTP/1.1 response.
fn dechunked(response: &str) -> Option<String> {
    let (_, mut rest) = response.split_once("\r\n\r\n")?;
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size, 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

/// A quick answer reaches the proxy whole: response head, a priming event,
/// the JSON-RPC response event and the end of the chunked body, in one
/// upstream write (as rmcp 3.11 sends a fast `tools/call`). It leaves the
/// proxy in one write to the client too, passed through (id 1) or with its
/// id restored (an id in the guard's namespace is always remapped). Passed on
/// chunk by chunk it took three (head and first event, second event, end of
/// body), each a round through the loopback TCP stack and a wake-up of the
/// client; that was most of the proxy's gap to nginx. Counted on the proxy's
/// client socket, on a single-threaded runtime so the order of the tasks is
/// fixed.
#[tokio::test]
async fn an_answer_that_arrives_whole_leaves_in_one_write() -> anyhow::Result<()> {
    for id in ["1", r#""mcp-id-guard:client-chosen""#] {
        let (upstream, upstream_task) = one_write_upstream(
            |id| {
                format!(
                    "{SSE_HEAD}{}{}0\r\n\r\n",
                    chunk(PRIMING),
                    chunk(&answer(id))
                )
            },
            false,
        )
        .await?;
        let (mut client, writes, guard, server) = counted_exchange(upstream, id).await?;
        let mut response = Vec::new();
        read_until(&mut client, &mut response, b"\r\n0\r\n\r\n").await?;
        let response = String::from_utf8(response)?;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        let body = dechunked(&response).ok_or_else(|| anyhow::anyhow!("{response:?}"))?;
        let expected = format!("\"id\":{id},\"result\"");
        assert!(body.contains(PRIMING) && body.contains(&expected), "{body}");
        let writes = writes.load(Ordering::SeqCst);
        println!("writes to the client for one whole answer to id {id}: {writes}");
        assert_eq!(writes, 1, "the answer to id {id} left in {writes} writes");
        drained(&guard).await?;
        server.abort();
        upstream_task.abort();
    }
    Ok(())
}

/// The upstream sends an event and then breaks off, all in one write: the
/// proxy takes both ahead, passes the event on, and then cuts the client's
/// response (no end of chunked body) instead of ending it as complete; the
/// id is released.
#[tokio::test]
async fn an_upstream_that_breaks_off_right_after_an_event_cuts_the_response() -> anyhow::Result<()>
{
    use tokio::io::AsyncReadExt;
    let (upstream, upstream_task) =
        one_write_upstream(|_| format!("{SSE_HEAD}{}", chunk(PRIMING)), true).await?;
    let (mut client, _writes, guard, server) = counted_exchange(upstream, "1").await?;
    let mut response = Vec::new();
    tokio::time::timeout(OK_TIMEOUT, client.read_to_end(&mut response)).await??;
    let response = String::from_utf8(response)?;
    assert!(response.contains(PRIMING), "{response}");
    assert!(
        !response.contains("\r\n0\r\n\r\n"),
        "ended as complete: {response}"
    );
    drained(&guard).await?;
    server.abort();
    upstream_task.abort();
    Ok(())
}
