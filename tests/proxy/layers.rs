//! The protection layers of `mcp_id_guard::protect` composed in an axum app
//! with `IdGuardLayer` and the proxy (or a handler that reads the body), over
//! loopback: each refusal next to its control, the same app without the
//! layer.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::Request;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper_util::rt::TokioIo;
use mcp_id_guard::protect::head::HeadLimitLayer;
use mcp_id_guard::protect::host::{HostLayer, HostPolicy};
use mcp_id_guard::protect::pace::BodyPaceLayer;
use mcp_id_guard::proxy::Proxy;
use mcp_id_guard::IdGuardLayer;
use serde_json::Value;
use tokio::sync::mpsc;
use tower::ServiceBuilder;
use tower_layer::Layer;

use crate::support::client::initialize_message;
use crate::support::server::{upstream, McpServer};
use crate::support::{ACCEPT, OK_TIMEOUT, WAIT_TIMEOUT};

/// Serves `app` on `127.0.0.1:<ephemeral>`; the server task ends with the
/// test's runtime.
async fn serve(app: Router) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The `initialize` this file's clients send.
fn initialize() -> Value {
    initialize_message("layers-test")
}

/// POSTs an `initialize` to `http://{addr}/mcp` with extra headers; the
/// status and body.
async fn post_initialize(
    addr: SocketAddr,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, String)> {
    let mut request = reqwest::Client::new()
        .post(format!("http://{addr}/mcp"))
        .header("accept", ACCEPT)
        .header("content-type", "application/json")
        .body(initialize().to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = tokio::time::timeout(OK_TIMEOUT, request.send()).await??;
    let status = response.status().as_u16();
    let body = tokio::time::timeout(OK_TIMEOUT, response.text()).await??;
    Ok((status, body))
}

/// A JSON-RPC error with `id: null` and code `-32600`, as the layers answer.
fn assert_refusal(body: &str) -> anyhow::Result<Value> {
    let error: Value = serde_json::from_str(body)?;
    assert_eq!(error["jsonrpc"], "2.0", "{body}");
    assert_eq!(error["id"], Value::Null, "{body}");
    assert_eq!(error["error"]["code"], -32600, "{body}");
    Ok(error)
}

/// The guarded proxy in front of `rmcp` on `/mcp`, with `protect` (or
/// nothing) as the app's outer layer.
async fn guarded_proxy_app(
    rmcp: &McpServer,
    host: Option<HostLayer>,
) -> anyhow::Result<SocketAddr> {
    let guarded = IdGuardLayer::new().layer(Proxy::new(&rmcp.base)?);
    let app = Router::new().route_service("/mcp", guarded);
    let app = match host {
        Some(layer) => app.layer(layer),
        None => app,
    };
    serve(app).await
}

/// A rebound page's `initialize` (its own name as `Host`, on the loopback
/// address the app listens on) is refused with 421 by `HostLayer` in front of
/// the guarded proxy; without the layer the proxy, which sets `Host` to the
/// upstream's own, gets it answered 200.
#[tokio::test]
async fn host_layer_refuses_a_rebound_host_before_the_guard_and_proxy() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let rebound = [("host", "evil.example:8080")];

    let open = guarded_proxy_app(&rmcp, None).await?;
    let (status, body) = post_initialize(open, &rebound).await?;
    assert_eq!(
        status, 200,
        "control: the rebound initialize passed: {body}"
    );

    let protected = guarded_proxy_app(&rmcp, Some(HostLayer::new(HostPolicy::loopback()))).await?;
    let (status, body) = post_initialize(protected, &rebound).await?;
    assert_eq!(status, 421, "{body}");
    let error = assert_refusal(&body)?;
    assert!(error["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("Host"));

    // Its own loopback name passes.
    let own = protected.to_string();
    let (status, body) = post_initialize(protected, &[("host", &own)]).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        rmcp.tap.posted().len(),
        2,
        "the refused request reached rmcp"
    );
    Ok(())
}

/// The right `Host` but a foreign page's `Origin`: 403 with the layer, 200
/// without.
#[tokio::test]
async fn host_layer_refuses_a_foreign_origin() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let open = guarded_proxy_app(&rmcp, None).await?;
    let own = open.to_string();
    let foreign = [
        ("host", own.as_str()),
        ("origin", "http://evil.example:8080"),
    ];
    let (status, body) = post_initialize(open, &foreign).await?;
    assert_eq!(status, 200, "control: the foreign origin passed: {body}");

    let protected = guarded_proxy_app(&rmcp, Some(HostLayer::default())).await?;
    let own = protected.to_string();
    let foreign = [
        ("host", own.as_str()),
        ("origin", "http://evil.example:8080"),
    ];
    let (status, body) = post_initialize(protected, &foreign).await?;
    assert_eq!(status, 403, "{body}");
    let error = assert_refusal(&body)?;
    assert!(error["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("Origin"));
    let local = [("host", own.as_str()), ("origin", "http://localhost:5173")];
    let (status, body) = post_initialize(protected, &local).await?;
    assert_eq!(status, 200, "a loopback origin was refused: {body}");
    Ok(())
}

/// A head over the limit gets 431 and a JSON-RPC error from
/// `HeadLimitLayer`; one under it passes; without the layer the large head
/// passes too.
#[tokio::test]
async fn head_limit_layer_refuses_large_heads() -> anyhow::Result<()> {
    const LIMIT: usize = 2048;
    let rmcp = upstream().await?;
    let guarded =
        || -> anyhow::Result<_> { Ok(IdGuardLayer::new().layer(Proxy::new(&rmcp.base)?)) };
    let app = |limit: Option<usize>| -> anyhow::Result<Router> {
        Ok(match limit {
            Some(limit) => {
                let service = ServiceBuilder::new()
                    .layer(HeadLimitLayer::new(limit))
                    .service(guarded()?);
                Router::new().route_service("/mcp", service)
            }
            None => Router::new().route_service("/mcp", guarded()?),
        })
    };
    let padding = "a".repeat(LIMIT);
    let large = [("x-padding", padding.as_str())];

    let open = serve(app(None)?).await?;
    let (status, body) = post_initialize(open, &large).await?;
    assert_eq!(status, 200, "control: the large head passed: {body}");

    let limited = serve(app(Some(LIMIT))?).await?;
    let (status, body) = post_initialize(limited, &large).await?;
    assert_eq!(status, 431, "{body}");
    let error = assert_refusal(&body)?;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("2048 bytes"),
        "{body}"
    );
    let small = [("x-padding", "a")];
    let (status, body) = post_initialize(limited, &small).await?;
    assert_eq!(status, 200, "{body}");
    Ok(())
}

// ---------------------------------------------------------------------------
// Body pace
// ---------------------------------------------------------------------------

/// How many bytes each body test sends.
const BODY_BYTES: usize = 30;
/// The trickle: one byte per interval (10 B/s).
const TRICKLE_INTERVAL: Duration = Duration::from_millis(100);

/// A handler that reads the whole body and answers 200 with its length
/// (axum answers 400 itself when the body fails), behind `pace` (or bare).
async fn reading_app(pace: Option<BodyPaceLayer>) -> anyhow::Result<SocketAddr> {
    let read = axum::routing::post(|body: Bytes| async move { body.len().to_string() });
    let app = Router::new().route("/upload", read);
    let app = match pace {
        Some(layer) => app.layer(layer),
        None => app,
    };
    serve(app).await
}

/// grace 200 ms, at least 100 B/s, pauses of at most 2 s: the trickle is ten
/// times too slow, while no single pause comes near the idle timeout.
fn short_pace() -> BodyPaceLayer {
    BodyPaceLayer::new()
        .grace(Duration::from_millis(200))
        .min_rate(100)
        .idle_timeout(Some(Duration::from_secs(2)))
}

type Chunks = mpsc::Sender<Result<Frame<Bytes>, std::convert::Infallible>>;

/// What one request over its own HTTP/1.1 connection got back.
/// The pace layer's `408`: a JSON-RPC refusal whose message says `why`, on
/// a connection that closes after it.
fn assert_timed_out(answer: &Answer, why: &str) -> anyhow::Result<()> {
    assert_eq!(answer.status, 408, "{}", answer.body);
    let error = assert_refusal(&answer.body)?;
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{error}");
    assert_eq!(answer.connection.as_deref(), Some("close"));
    Ok(())
}

struct Answer {
    status: u16,
    connection: Option<String>,
    body: String,
    /// Resolves when the client's connection has ended.
    closed: tokio::task::JoinHandle<()>,
}

/// Opens a connection to `addr`, POSTs a body fed by the returned sender
/// (chunked: no length announced), and returns the sender and the pending
/// answer.
async fn post_fed(
    addr: SocketAddr,
) -> anyhow::Result<(
    Chunks,
    impl std::future::Future<Output = anyhow::Result<Answer>>,
)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let closed = tokio::spawn(async move {
        let _ = connection.await;
    });
    let (chunks, frames) = mpsc::channel(BODY_BYTES + 1);
    let stream = futures::stream::unfold(frames, |mut frames| async move {
        frames.recv().await.map(|frame| (frame, frames))
    });
    let request = Request::post("/upload")
        .header("host", addr.to_string())
        .header("content-type", "application/octet-stream")
        .body(StreamBody::new(stream))?;
    let answer = async move {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let connection = response
            .headers()
            .get("connection")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            connection,
            body: String::from_utf8_lossy(&body).into_owned(),
            closed,
        })
    };
    Ok((chunks, answer))
}

/// Sends `BODY_BYTES` single bytes, one per `TRICKLE_INTERVAL` (the pace
/// under test), then ends the body; stops when the request is gone.
fn trickle(chunks: Chunks) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for _ in 0..BODY_BYTES {
            if chunks
                .send(Ok(Frame::data(Bytes::from_static(b"x"))))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(TRICKLE_INTERVAL).await;
        }
    })
}

/// One byte every 100 ms never pauses for long, so only the minimum rate
/// cuts it: 408 with a JSON-RPC error, `Connection: close`, and the
/// connection closed. Control: the bare handler reads it to the end and
/// answers 200.
#[tokio::test]
async fn a_trickling_body_is_cut_by_the_minimum_rate() -> anyhow::Result<()> {
    let bare = reading_app(None).await?;
    let (chunks, answer) = post_fed(bare).await?;
    let sending = trickle(chunks);
    let answer = tokio::time::timeout(OK_TIMEOUT, answer).await??;
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, "30"),
        "control: the bare server waited for the whole trickle"
    );
    sending.await?;

    let paced = reading_app(Some(short_pace())).await?;
    let (chunks, answer) = post_fed(paced).await?;
    let sending = trickle(chunks);
    let answer = tokio::time::timeout(OK_TIMEOUT, answer).await??;
    assert_timed_out(&answer, "100 bytes per second")?;
    tokio::time::timeout(WAIT_TIMEOUT, answer.closed)
        .await
        .map_err(|_| anyhow::anyhow!("the server kept the connection open"))??;
    tokio::time::timeout(WAIT_TIMEOUT, sending).await??;
    Ok(())
}

/// The same 30 bytes at once pass the same pace.
#[tokio::test]
async fn a_body_at_a_normal_rate_passes() -> anyhow::Result<()> {
    let paced = reading_app(Some(short_pace())).await?;
    let (chunks, answer) = post_fed(paced).await?;
    for _ in 0..BODY_BYTES {
        chunks
            .send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .await?;
    }
    drop(chunks);
    let answer = tokio::time::timeout(OK_TIMEOUT, answer).await??;
    assert_eq!((answer.status, answer.body.as_str()), (200, "30"));
    assert_eq!(answer.connection, None);
    Ok(())
}

/// A body that stops (its sender held open) gets 408 once the idle timeout
/// passes, with the minimum rate off. Control: the bare handler waits for
/// it for as long as the test does.
#[tokio::test]
async fn a_paused_body_is_cut_by_the_idle_timeout() -> anyhow::Result<()> {
    let bare = reading_app(None).await?;
    let (chunks, answer) = post_fed(bare).await?;
    chunks
        .send(Ok(Frame::data(Bytes::from_static(b"x"))))
        .await?;
    let waited = tokio::time::timeout(Duration::from_secs(1), answer).await;
    assert!(
        waited.is_err(),
        "control: the bare server answered a paused body"
    );
    drop(chunks);

    let idle = BodyPaceLayer::new()
        .min_rate(0)
        .idle_timeout(Some(Duration::from_millis(300)));
    let paced = reading_app(Some(idle)).await?;
    let (chunks, answer) = post_fed(paced).await?;
    chunks
        .send(Ok(Frame::data(Bytes::from_static(b"x"))))
        .await?;
    let answer = tokio::time::timeout(OK_TIMEOUT, answer).await??;
    assert_timed_out(&answer, "no request body data")?;
    drop(chunks);
    Ok(())
}
