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
