//! Failures around the proxy: an upstream that is down, slow to accept, hangs
//! up before answering or in the middle of a stream, and a client that goes
//! away mid-stream. Never a hang; every in-flight id is released.
use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use mcp_id_guard::proxy::Proxy;
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower_layer::Layer;

use crate::support::server::{refused_port, serve_proxy, serve_service, Served};
use crate::support::sse::first_event;
use crate::support::wait::drained;
use crate::support::OK_TIMEOUT;

/// How long a 502 may take when the upstream is down (the connect timeout
/// of [`serve_proxy`] is 2 s; a refused connection is immediate).
const FAIL_FAST: Duration = Duration::from_secs(5);

async fn post(url: &str, session: Option<&str>, body: String) -> anyhow::Result<reqwest::Response> {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("accept", crate::support::ACCEPT)
        .header("content-type", "application/json");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    Ok(tokio::time::timeout(FAIL_FAST, request.body(body).send()).await??)
}

async fn json_body(response: reqwest::Response) -> anyhow::Result<Value> {
    assert_eq!(response.headers()["content-type"], "application/json");
    Ok(serde_json::from_str(
        &tokio::time::timeout(OK_TIMEOUT, response.text()).await??,
    )?)
}

fn assert_bad_gateway(error: &Value, id: Value) {
    assert_eq!(error["jsonrpc"], "2.0");
    assert_eq!(error["id"], id, "{error}");
    assert_eq!(error["error"]["code"], -32603, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.starts_with("Bad Gateway")),
        "{error}"
    );
}

/// Upstream down (a port nothing listens on): 502 at once, with a JSON-RPC
/// -32603 error carrying the request's id where there is one: tracked
/// POSTs, a remapped one (its id restored by the guard), a batch (one error
/// per request), an untracked POST of known length; `null` for GET.
#[tokio::test]
async fn upstream_down_answers_502_with_the_request_id() -> anyhow::Result<()> {
    let guard = IdGuardLayer::new();
    let refused = refused_port();
    let proxy = serve_proxy(&format!("http://127.0.0.1:{}/mcp", refused.port), &guard).await?;
    let url = format!("http://{}/mcp", proxy.addr);

    let started = Instant::now();
    let response = post(
        &url,
        Some("s"),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call"}).to_string(),
    )
    .await?;
    println!("502 for a refused connection after {:?}", started.elapsed());
    assert_eq!(response.status(), 502);
    assert_bad_gateway(&json_body(response).await?, json!(7));

    let reserved = "mcp-id-guard:looks-remapped";
    let response = post(
        &url,
        Some("s"),
        json!({"jsonrpc": "2.0", "id": reserved, "method": "tools/call"}).to_string(),
    )
    .await?;
    assert_eq!(response.status(), 502);
    assert_bad_gateway(&json_body(response).await?, json!(reserved));

    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "a"},
        {"jsonrpc": "2.0", "method": "notifications/x"},
        {"jsonrpc": "2.0", "id": "b", "method": "b"},
    ]);
    let response = post(&url, Some("s"), batch.to_string()).await?;
    assert_eq!(response.status(), 502);
    let errors = json_body(response).await?;
    assert_eq!(errors.as_array().map(Vec::len), Some(2), "{errors}");
    assert_bad_gateway(&errors[0], json!(1));
    assert_bad_gateway(&errors[1], json!("b"));

    let response = post(
        &url,
        None,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize"}).to_string(),
    )
    .await?;
    assert_eq!(response.status(), 502);
    assert_bad_gateway(&json_body(response).await?, json!(0));

    let response = tokio::time::timeout(
        FAIL_FAST,
        reqwest::Client::new()
            .get(&url)
            .header("accept", "text/event-stream")
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 502);
    assert_bad_gateway(&json_body(response).await?, Value::Null);

    let stats = drained(&guard).await?;
    assert_eq!((stats.passed_total, stats.remapped_total), (3, 1));
    Ok(())
}

/// An upstream that does not accept the connection (its accept queue is
/// full) gets a 502 once the connect timeout passes, not a hang.
#[tokio::test]
async fn connect_timeout_answers_502() -> anyhow::Result<()> {
    // Backlog 0: one connection fills the accept queue; later SYNs are
    // dropped, so connecting hangs until the connector's timeout.
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind("127.0.0.1:0".parse()?)?;
    let listener = socket.listen(0)?;
    let addr = listener.local_addr()?;
    let _queued = std::net::TcpStream::connect(addr)?;

    let timeout = Duration::from_millis(300);
    let proxy = Proxy::builder()
        .connect_timeout(timeout)
        .build(&format!("http://{addr}"))?;
    let guard = IdGuardLayer::new();
    let served = serve_service(guard.layer(proxy)).await?;

    let started = Instant::now();
    let response = post(
        &format!("http://{}/mcp", served.addr),
        Some("s"),
        json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/list"}).to_string(),
    )
    .await?;
    let elapsed = started.elapsed();
    println!("502 for a connect timeout of {timeout:?} after {elapsed:?}");
    assert_eq!(response.status(), 502);
    assert!(elapsed >= timeout, "{elapsed:?}");
    let error = json_body(response).await?;
    assert_bad_gateway(&error, json!("slow"));
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("in time")),
        "{error}"
    );
    drained(&guard).await?;
    drop(listener);
    Ok(())
}

/// An upstream that accepts the connection and closes it without answering:
/// 502 with the request's id.
#[tokio::test]
async fn upstream_hanging_up_before_answering_is_502() -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{addr}"), &guard).await?;
    let response = post(
        &format!("http://{}/mcp", proxy.addr),
        Some("s"),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}).to_string(),
    )
    .await?;
    assert_eq!(response.status(), 502);
    assert_bad_gateway(&json_body(response).await?, json!(3));
    drained(&guard).await?;
    Ok(())
}

/// One request at a scripted SSE upstream: the test writes the stream.
struct Call {
    id: Value,
    events: mpsc::Sender<Result<Bytes, std::io::Error>>,
}

type ScriptedBody =
    StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>>;

/// An upstream whose SSE responses the test scripts through [`Call`]s.
async fn scripted_upstream() -> anyhow::Result<(Served, mpsc::UnboundedReceiver<Call>)> {
    let (calls_tx, calls_rx) = mpsc::unbounded_channel();
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let calls = calls_tx.clone();
        async move {
            let body = request
                .into_body()
                .collect()
                .await
                .map(|body| body.to_bytes());
            let id = body
                .ok()
                .and_then(|body| serde_json::from_slice::<Value>(&body).ok())
                .map(|message| message["id"].clone())
                .unwrap_or(Value::Null);
            let (events, mut rx) = mpsc::channel(1);
            let _ = calls.send(Call { id, events });
            let stream = futures::stream::poll_fn(move |cx| {
                rx.poll_recv(cx)
                    .map(|item| item.map(|item| item.map(Frame::data)))
            });
            let body: ScriptedBody = StreamBody::new(Box::pin(stream));
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap(),
            )
        }
    });
    Ok((serve_service(service).await?, calls_rx))
}

async fn next_call(calls: &mut mpsc::UnboundedReceiver<Call>) -> anyhow::Result<Call> {
    tokio::time::timeout(OK_TIMEOUT, calls.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("upstream gone"))
}

fn event(data: Value) -> Result<Bytes, std::io::Error> {
    Ok(Bytes::from(format!("data: {data}\n\n")))
}

/// The upstream breaks off in the middle of an SSE stream: the client's
/// stream ends (with an error: it was cut, not completed) instead of hanging,
/// and the request's id is released.
#[tokio::test]
async fn upstream_closing_mid_stream_ends_the_clients_stream() -> anyhow::Result<()> {
    let (upstream, mut calls) = scripted_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;

    let mut response = post(
        &format!("http://{}/mcp", proxy.addr),
        Some("s"),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}).to_string(),
    )
    .await?;
    let call = next_call(&mut calls).await?;
    call.events
        .send(event(
            json!({"jsonrpc": "2.0", "method": "notifications/progress"}),
        ))
        .await?;
    tokio::time::timeout(OK_TIMEOUT, first_event(&mut response)).await??;
    assert_eq!(guard.stats().in_flight_requests, 1);

    call.events
        .send(Err(std::io::Error::other("upstream crashed")))
        .await?;
    let end = tokio::time::timeout(OK_TIMEOUT, async {
        loop {
            match response.chunk().await {
                Ok(Some(_)) => continue,
                Ok(None) => break "ended",
                Err(_) => break "cut",
            }
        }
    })
    .await?;
    println!("client stream after the upstream broke off: {end}");
    assert_eq!(end, "cut");
    drained(&guard).await?;
    Ok(())
}

/// Clients that disconnect mid-stream (one passed, one remapped, both
/// `id: 1`) release their ids, and the proxy closes their upstream requests.
#[tokio::test]
async fn client_disconnecting_mid_stream_releases_its_id() -> anyhow::Result<()> {
    let (upstream, mut calls) = scripted_upstream().await?;
    let guard = IdGuardLayer::new().on_duplicate(OnDuplicate::Remap);
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let url = format!("http://{}/mcp", proxy.addr);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}).to_string();

    let mut first = post(&url, Some("s"), body.clone()).await?;
    let first_call = next_call(&mut calls).await?;
    let mut second = post(&url, Some("s"), body).await?;
    let second_call = next_call(&mut calls).await?;
    assert_eq!(first_call.id, 1);
    assert!(
        second_call
            .id
            .as_str()
            .is_some_and(|id| id.starts_with("mcp-id-guard:")),
        "{:?}",
        second_call.id
    );
    for (call, response) in [(&first_call, &mut first), (&second_call, &mut second)] {
        call.events
            .send(event(
                json!({"jsonrpc": "2.0", "method": "notifications/progress"}),
            ))
            .await?;
        tokio::time::timeout(OK_TIMEOUT, first_event(response)).await??;
    }
    assert_eq!(guard.stats().in_flight_requests, 2);

    drop(first);
    drop(second);
    // The proxy drops the upstream responses, closing their streams.
    for call in [&first_call, &second_call] {
        tokio::time::timeout(OK_TIMEOUT, call.events.closed()).await?;
    }
    let stats = drained(&guard).await?;
    assert_eq!((stats.passed_total, stats.remapped_total), (1, 1));
    Ok(())
}

/// Reads one `ping` request (its body ends with `"ping"}`) from a raw
/// upstream socket and answers it with a JSON-RPC result carrying its id, on
/// a keep-alive HTTP/1.1 response; `false` when the socket failed first.
async fn answer_one_ping(socket: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut request = Vec::new();
    while !request.ends_with(b"\"ping\"}") {
        let mut chunk = [0u8; 4096];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => request.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&request);
    let id = text
        .split("\"id\":")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or("null");
    let answer = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#);
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
        answer.len()
    );
    socket.write_all(response.as_bytes()).await.is_ok()
}

/// An upstream that answers each request and keeps the connection (no
/// `Connection: close`), then closes it without notice when told to
/// (`close`), as a server restarting or trimming its idle connections does,
/// and says so (`closed`). Counts the connections it accepts.
struct ClosingUpstream {
    addr: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    close: std::sync::Arc<tokio::sync::Notify>,
    closed: mpsc::UnboundedReceiver<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn closing_upstream() -> anyhow::Result<ClosingUpstream> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let close = Arc::new(tokio::sync::Notify::new());
    let (closed_tx, closed) = mpsc::unbounded_channel();
    let (counter, closer) = (Arc::clone(&accepted), Arc::clone(&close));
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let (closer, closed_tx) = (Arc::clone(&closer), closed_tx.clone());
            tokio::spawn(async move {
                if answer_one_ping(&mut socket).await {
                    closer.notified().await;
                }
                drop(socket);
                let _ = closed_tx.send(());
            });
        }
    });
    Ok(ClosingUpstream {
        addr,
        accepted,
        close,
        closed,
        task,
    })
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_replaced() -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let mut upstream = closing_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let client = reqwest::Client::new();
    for id in 1..=3 {
        let response = tokio::time::timeout(
            OK_TIMEOUT,
            client
                .post(format!("http://{}/mcp", proxy.addr))
                .header("content-type", "application/json")
                .header("accept", crate::support::ACCEPT)
                .header("mcp-session-id", "s")
                .body(json!({"jsonrpc": "2.0", "id": id, "method": "ping"}).to_string())
                .send(),
        )
        .await??;
        assert_eq!(response.status(), 200, "request {id}");
        let answer: Value = serde_json::from_str(&response.text().await?)?;
        assert_eq!(answer["id"], id);
        // The answer has been read whole, so its connection is back in the
        // pool; only now does the upstream close it.
        upstream.close.notify_one();
        tokio::time::timeout(OK_TIMEOUT, upstream.closed.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("upstream gone"))?;
    }
    println!(
        "3 requests, each pooled connection closed by the upstream before the next: {} connections",
        upstream.accepted.load(Ordering::SeqCst)
    );
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 3);
    drained(&guard).await?;
    upstream.task.abort();
    Ok(())
}

/// An upstream for one keep-alive connection: answers one `ping`, then
/// reports (on the channel) when the proxy closes the connection.
async fn closure_watching_upstream() -> anyhow::Result<(
    std::net::SocketAddr,
    tokio::sync::oneshot::Receiver<Instant>,
    tokio::task::JoinHandle<()>,
)> {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        if !answer_one_ping(&mut socket).await {
            return;
        }
        let mut rest = [0u8; 64];
        // EOF (or a reset) is the proxy closing its idle connection.
        let _ = socket.read(&mut rest).await;
        let _ = closed_tx.send(Instant::now());
    });
    Ok((addr, closed, task))
}

/// Idle pooled connections are closed, not only left unused: with a 300 ms
/// pool idle timeout the upstream sees its connection closed within about
/// 1.125 times that; with 90 s (hyper-util's old default) it is still open
/// a second later.
#[tokio::test]
async fn idle_upstream_connections_are_closed_in_time() -> anyhow::Result<()> {
    for (idle, closes) in [
        (Duration::from_secs(90), false),
        (Duration::from_millis(300), true),
    ] {
        let (upstream, closed, task) = closure_watching_upstream().await?;
        let guard = IdGuardLayer::new();
        let proxy = Proxy::builder()
            .pool_idle_timeout(idle)
            .build(&format!("http://{upstream}"))?;
        let served = serve_service(guard.layer(proxy)).await?;
        let response = tokio::time::timeout(
            OK_TIMEOUT,
            reqwest::Client::new()
                .post(format!("http://{}/mcp", served.addr))
                .header("content-type", "application/json")
                .body(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string())
                .send(),
        )
        .await??;
        assert_eq!(response.status(), 200);
        response.text().await?;
        let answered = Instant::now();
        let waited = tokio::time::timeout(Duration::from_secs(1), closed).await;
        println!(
            "pool idle {idle:?}: upstream connection {}",
            match &waited {
                Ok(Ok(at)) => format!("closed {:?} after the answer", at.duration_since(answered)),
                _ => "still open after 1 s".to_owned(),
            }
        );
        if closes {
            let at = waited??;
            assert!(
                at.duration_since(answered) < Duration::from_millis(900),
                "{idle:?}"
            );
        } else {
            assert!(waited.is_err(), "closed with a {idle:?} idle timeout");
        }
        task.abort();
    }
    Ok(())
}

/// An upstream that accepts connections, reads what comes and never answers.
async fn silent_upstream() -> anyhow::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            // Kept open, never written to.
            sockets.push(socket);
        }
    });
    Ok((addr, task))
}

/// Whether the upstream received the next request under a server-side id.
async fn next_is_remapped(calls: &mut mpsc::UnboundedReceiver<Call>) -> anyhow::Result<bool> {
    let call = next_call(calls).await?;
    Ok(call
        .id
        .as_str()
        .is_some_and(|id| id.starts_with("mcp-id-guard:")))
}

/// However the upstream ends an exchange without its response — a stream it
/// breaks off after a progress notification, or one it closes after a
/// priming event to have the client poll (SEP-1699) — the server may still be
/// running the request: its id stays abandoned, and the next request with it
/// reaches the upstream under a server-side id. (Before, both endings freed
/// the id: the next `1` went to a server still running `1`.)
#[tokio::test]
async fn an_exchange_that_ends_without_its_response_leaves_the_id_abandoned() -> anyhow::Result<()>
{
    let (upstream, mut calls) = scripted_upstream().await?;
    for ending in ["broken off", "closed after priming"] {
        let guard = IdGuardLayer::new();
        let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
        let url = format!("http://{}/mcp", proxy.addr);
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}).to_string();

        let mut response = post(&url, Some("s"), body.clone()).await?;
        let call = next_call(&mut calls).await?;
        assert_eq!(call.id, 1, "{ending}: the first 1 goes as it is");
        let first = if ending == "broken off" {
            json!({"jsonrpc": "2.0", "method": "notifications/progress"}).to_string()
        } else {
            String::new()
        };
        call.events
            .send(Ok(Bytes::from(format!(
                "id: 0\nretry: 100\ndata: {first}\n\n"
            ))))
            .await?;
        tokio::time::timeout(OK_TIMEOUT, first_event(&mut response)).await??;
        if ending == "broken off" {
            call.events
                .send(Err(std::io::Error::other("crashed")))
                .await?;
        }
        drop(call);
        // The client reads its stream to the end (or to the cut).
        tokio::time::timeout(OK_TIMEOUT, async {
            while let Ok(Some(_)) = response.chunk().await {}
        })
        .await?;
        let stats = drained(&guard).await?;
        assert_eq!(stats.abandoned_ids, 1, "{ending}: {stats:?}");

        let mut again = post(&url, Some("s"), body.clone()).await?;
        assert!(
            next_is_remapped(&mut calls).await?,
            "{ending}: the server may still run 1"
        );
        drop(again.chunk());
    }
    Ok(())
}

/// The proxy's own 504 after the request went upstream is no response from
/// the server, which may still be running it: the id stays abandoned. A 504
/// for a request that never left (its deadline passed while it waited for an
/// upstream connection) frees its id at once.
#[tokio::test]
async fn a_stand_in_504_frees_an_id_only_if_the_request_never_left() -> anyhow::Result<()> {
    let call = |id: u32| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call"}).to_string();
    let proxy = |upstream: std::net::SocketAddr| {
        Proxy::builder()
            .connect_timeout(Duration::from_secs(2))
            .max_connections(Some(1))
            .connection_wait(Duration::from_secs(30))
            .response_timeout(Some(Duration::from_millis(300)))
            .build(&format!("http://{upstream}/mcp"))
    };

    // Sent, never answered.
    let (silent, _task) = silent_upstream().await?;
    let guard = IdGuardLayer::new();
    let served = serve_service(guard.layer(proxy(silent)?)).await?;
    let response = post(&format!("http://{}/mcp", served.addr), Some("s"), call(1)).await?;
    assert_eq!(response.status(), 504);
    assert_eq!(json_body(response).await?["error"]["code"], -32603);
    let stats = drained(&guard).await?;
    assert_eq!(
        stats.abandoned_ids, 1,
        "1 was sent and may still run: {stats:?}"
    );

    // Never sent: the only connection carries a stream that stays open.
    let (upstream, mut calls) = scripted_upstream().await?;
    let guard = IdGuardLayer::new();
    let served = serve_service(guard.layer(proxy(upstream.addr)?)).await?;
    let url = format!("http://{}/mcp", served.addr);
    let mut open = post(&url, Some("s"), call(1)).await?;
    let first = next_call(&mut calls).await?;
    first
        .events
        .send(event(
            json!({"jsonrpc": "2.0", "method": "notifications/progress"}),
        ))
        .await?;
    tokio::time::timeout(OK_TIMEOUT, first_event(&mut open)).await??;
    let waited = post(&url, Some("s"), call(2)).await?;
    assert_eq!(waited.status(), 504);
    let stats = guard.stats();
    assert_eq!(
        (stats.in_flight_requests, stats.abandoned_ids),
        (1, 0),
        "2 never left: {stats:?}"
    );
    drop(first);
    drop(open);
    Ok(())
}
