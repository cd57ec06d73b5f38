//! The guard composed the ways applications use it: as a layer on an
//! `axum::Router` served over loopback and exercised with a real HTTP client
//! (reqwest), and inside a `tower::ServiceBuilder` stack with tower-http's
//! `TraceLayer`, `TimeoutLayer` and `RequestBodyLimitLayer`.
//!
//! The inner handler echoes each JSON-RPC request's id back in a JSON-RPC
//! response and records the id it saw. A request whose method is `hold`
//! reports its arrival on a channel and waits for a semaphore permit, so an
//! in-flight collision is created deterministically, without sleeping.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::StatusCode;
use mcp_id_guard::guard::GuardResponseBody as ResponseBody;
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use serde_json::value::RawValue;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::support::ids::server_side;
use crate::support::wait::{assert_drained, within};

const SESSION: &str = "session-axum";

/// The handler's shared state.
struct Echo {
    seen: Mutex<Vec<String>>,
    entered: mpsc::UnboundedSender<String>,
    gate: Semaphore,
}

#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<String>,
}

/// Echoes a JSON-RPC request's id; holds `hold` requests until released.
async fn mcp(State(echo): State<Arc<Echo>>, body: Bytes) -> Response {
    let Ok(envelope) = serde_json::from_slice::<Envelope<'_>>(&body) else {
        return StatusCode::ACCEPTED.into_response();
    };
    let (Some(id), Some(method)) = (envelope.id, envelope.method) else {
        return StatusCode::ACCEPTED.into_response();
    };
    let id = id.get().to_owned();
    echo.seen.lock().unwrap().push(id.clone());
    if method == "hold" {
        let _ = echo.entered.send(id.clone());
        echo.gate
            .acquire()
            .await
            .expect("the gate is never closed")
            .forget();
    }
    ([(CONTENT_TYPE, "application/json")], answer_text(&id)).into_response()
}

pub(crate) fn request_text(id: &str, method: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#)
}

fn answer_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
}

/// A router served on 127.0.0.1 with an ephemeral port.
pub(crate) struct Server {
    pub(crate) url: String,
    echo: Arc<Echo>,
    entered: mpsc::UnboundedReceiver<String>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Serves the echo router after `wrap` added its layers.
    pub(crate) async fn start(wrap: impl FnOnce(Router) -> Router) -> Self {
        let (sender, entered) = mpsc::unbounded_channel();
        let echo = Arc::new(Echo {
            seen: Mutex::default(),
            entered: sender,
            gate: Semaphore::new(0),
        });
        let app = wrap(
            Router::new()
                .route("/mcp", post(mcp))
                .with_state(Arc::clone(&echo)),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let task = tokio::spawn(axum::serve(listener, app).into_future());
        Self {
            url,
            echo,
            entered,
            task,
        }
    }

    pub(crate) async fn entered(&mut self) -> String {
        within(self.entered.recv()).await.expect("server alive")
    }

    pub(crate) fn release(&self, permits: usize) {
        self.echo.gate.add_permits(permits);
    }

    fn seen(&self) -> Vec<String> {
        self.echo.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a plain HTTP client")
}

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    content_type: Option<String>,
    pub(crate) body: String,
}

pub(crate) async fn send(
    client: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
) -> Reply {
    within(async {
        let response = client
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", SESSION)
            .body(body)
            .send()
            .await
            .expect("the server answers");
        let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|value| value.to_str().unwrap().to_owned());
        let body = response.text().await.expect("a complete body");
        Reply {
            status,
            content_type,
            body,
        }
    })
    .await
}

/// Sends a request from its own task (for requests the echo holds).
pub(crate) fn spawn_send(
    client: &reqwest::Client,
    url: &str,
    body: String,
) -> tokio::task::JoinHandle<Reply> {
    let (client, url) = (client.clone(), url.to_owned());
    tokio::spawn(async move { send(&client, &url, body).await })
}

fn assert_duplicate_rejection(reply: &Reply, status: StatusCode, id: serde_json::Value) {
    assert_eq!(reply.status, status);
    assert_eq!(reply.content_type.as_deref(), Some("application/json"));
    let value: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON");
    assert_eq!(value["jsonrpc"], "2.0");
    assert_eq!(value["id"], id);
    assert_eq!(value["error"]["code"], -32600);
}

/// Runs the collision scenario against a served app: `1` is held in flight,
/// a second `1` arrives, then an unrelated `2`. Under `Remap` the second
/// reaches the handler with a server-side id and its client gets `1` back;
/// under `Reject` it gets the duplicate error and never reaches the handler.
/// Everything drains afterwards.
async fn collision_scenario(mut server: Server, layer: &IdGuardLayer, policy: OnDuplicate) {
    let client = client();
    let held = spawn_send(&client, &server.url, request_text("1", "hold"));
    assert_eq!(server.entered().await, "1");

    let duplicate = send(&client, &server.url, request_text("1", "tools/call")).await;
    match policy {
        OnDuplicate::Remap => {
            assert_eq!(duplicate.status, StatusCode::OK);
            assert_eq!(duplicate.body, answer_text("1"));
            server_side(&server.seen()[1]);
        }
        _ => {
            assert_duplicate_rejection(&duplicate, StatusCode::BAD_REQUEST, 1.into());
            assert_eq!(
                server.seen(),
                ["1"],
                "the duplicate never reached the handler"
            );
        }
    }

    let normal = send(&client, &server.url, request_text("2", "tools/call")).await;
    assert_eq!(normal.status, StatusCode::OK);
    assert_eq!(normal.body, answer_text("2"));
    assert_eq!(server.seen().last().unwrap(), "2");

    server.release(1);
    let held = within(held).await.unwrap();
    assert_eq!(
        (held.status, held.body.as_str()),
        (StatusCode::OK, &*answer_text("1"))
    );
    assert_drained(layer);
    let stats = layer.stats();
    match policy {
        OnDuplicate::Remap => assert_eq!((stats.passed_total, stats.remapped_total), (2, 1)),
        _ => assert_eq!((stats.passed_total, stats.rejected_total), (2, 1)),
    }
}

/// `Router::layer(IdGuardLayer)` over loopback with reqwest, `Remap`: the
/// duplicate is remapped and restored, a normal request passes.
#[tokio::test]
async fn router_layer_remaps_over_http() {
    let layer = IdGuardLayer::new();
    let server = Server::start(|router| router.layer(layer.clone())).await;
    collision_scenario(server, &layer, OnDuplicate::Remap).await;
}

/// `Router::layer(IdGuardLayer)` over loopback with reqwest, `Reject`: the
/// duplicate gets 400 and `-32600` with its id, a normal request passes.
#[tokio::test]
async fn router_layer_rejects_over_http() {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = Server::start(|router| router.layer(layer.clone())).await;
    collision_scenario(server, &layer, OnDuplicate::Reject).await;
}

/// Sequential reuse is always allowed, even across connections: an id is
/// released before its response reaches the client, so a client that reuses
/// it the moment it has read the response is never rejected. Alternates two
/// clients (two connections) under `Reject`, many times.
#[tokio::test]
async fn sequential_reuse_over_http_is_never_rejected() {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = Server::start(|router| router.layer(layer.clone())).await;
    let clients = [client(), client()];
    for round in 0..200 {
        let reply = send(
            &clients[round % 2],
            &server.url,
            request_text("1", "tools/call"),
        )
        .await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::OK, &*answer_text("1")),
            "round {round}"
        );
    }
    let stats = layer.stats();
    assert_eq!((stats.passed_total, stats.rejected_total), (200, 0));
    assert_drained(&layer);
}

/// Where the guard sits in the tower-http stack.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// The order that compiles as is, outermost first: `TraceLayer` →
    /// `IdGuardLayer` → `RequestBodyLimitLayer` → `TimeoutLayer` → the
    /// routes. Trace sees everything, the guard's own answers included; the
    /// body limit applies to what the guard forwards (the guard's own
    /// `max_body_bytes` bounds what it reads); the timeout answers 408 to the
    /// guard, which passes it on and releases the id when that answer's body
    /// ends.
    ///
    /// tower-http's `Timeout` builds its 408 with `ResBody::default()`, so it
    /// must sit directly on a service whose response body implements
    /// `Default` (axum's `Body`): neither tower-http's limit `ResponseBody`
    /// nor `mcp_id_guard::guard::GuardResponseBody` does.
    GuardOutside,
    /// `TraceLayer` → `RequestBodyLimitLayer` → `TimeoutLayer` → adapter →
    /// `IdGuardLayer` → the routes. The timeout then also bounds the guard's
    /// reading of the body, and when it fires it drops the guard's future.
    /// Because `mcp_id_guard::guard::GuardResponseBody` does not implement `Default`,
    /// this order needs the adapter: `map_response` into `axum::body::Body`.
    GuardInside,
}

/// The echo router wrapped in a `ServiceBuilder` stack in `order`, applied
/// with `Router::layer`, so it must compile as a tower stack around axum's
/// route service.
fn stack_router(
    router: Router,
    order: Order,
    guard: &IdGuardLayer,
    timeout: Duration,
    body_limit: usize,
) -> Router {
    let timeout = TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout);
    match order {
        Order::GuardOutside => router.layer(
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer(guard.clone())
                .layer(RequestBodyLimitLayer::new(body_limit))
                .layer(timeout),
        ),
        Order::GuardInside => router.layer(
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer(RequestBodyLimitLayer::new(body_limit))
                .layer(timeout)
                .map_response(|response: Response<ResponseBody<Body>>| response.map(Body::new))
                .layer(guard.clone()),
        ),
    }
}

const ORDERS: [Order; 2] = [Order::GuardOutside, Order::GuardInside];

/// In both `ServiceBuilder` stacks, `Remap`: a duplicate is remapped and
/// restored, a normal request passes.
#[tokio::test]
async fn service_builder_stack_remaps() {
    for order in ORDERS {
        let layer = IdGuardLayer::new();
        let server = Server::start(|router| {
            stack_router(router, order, &layer, Duration::from_secs(60), 64 * 1024)
        })
        .await;
        collision_scenario(server, &layer, OnDuplicate::Remap).await;
    }
}

/// In both `ServiceBuilder` stacks, `Reject`: a duplicate is rejected, a
/// normal request passes.
#[tokio::test]
async fn service_builder_stack_rejects() {
    for order in ORDERS {
        let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
        let server = Server::start(|router| {
            stack_router(router, order, &layer, Duration::from_secs(60), 64 * 1024)
        })
        .await;
        collision_scenario(server, &layer, OnDuplicate::Reject).await;
    }
}

/// When tower-http's timeout fires on a held request (in either order) the
/// handler is still running it under the client's id: the `408` is the
/// timeout's answer, not the server's. The id is abandoned, not freed, and
/// the next `1` reaches the handler with a server-side id while the first
/// still runs (an unguarded server would route the first's late answer to
/// it), gets its own answer, and is never refused. The held handler is never
/// released: the timeout, not a sleep, ends the exchange.
#[tokio::test]
async fn a_timeout_in_the_stack_leaves_the_id_abandoned() {
    for order in ORDERS {
        let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
        let mut server = Server::start(|router| {
            stack_router(router, order, &layer, Duration::from_millis(300), 64 * 1024)
        })
        .await;
        let client = client();
        let held = spawn_send(&client, &server.url, request_text("1", "hold"));
        server.entered().await;
        assert_eq!(layer.stats().in_flight_requests, 1);
        let held = within(held).await.unwrap();
        assert_eq!(held.status, StatusCode::REQUEST_TIMEOUT, "{order:?}");
        assert_drained(&layer);
        assert_eq!(
            layer.stats().abandoned_ids,
            1,
            "{order:?}: the handler may still answer 1"
        );
        let again = send(&client, &server.url, request_text("1", "tools/call")).await;
        assert_eq!(again.body, answer_text("1"), "{order:?}");
        let seen = server.seen();
        assert_eq!(seen[0], "1", "{order:?}");
        server_side(&seen[1]);
        assert_eq!(layer.stats().rejected_total, 0);
    }
}

fn padded_request(size: usize) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"pad":"{}"}}}}"#,
        "x".repeat(size)
    )
}

/// A body sent chunked (no `Content-Length`), 256 bytes per chunk.
fn streamed(text: &str) -> reqwest::Body {
    let chunks: Vec<Result<Bytes, std::io::Error>> = text
        .as_bytes()
        .chunks(256)
        .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
        .collect();
    reqwest::Body::wrap_stream(futures::stream::iter(chunks))
}

fn assert_guard_error(reply: &Reply, status: StatusCode) {
    assert_eq!(reply.status, status);
    assert_eq!(reply.content_type.as_deref(), Some("application/json"));
    let value: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(value["id"], serde_json::Value::Null);
    assert_eq!(value["error"]["code"], -32600);
}

/// `GuardOutside`: the guard reads an oversize body (within its own limit),
/// registers it and forwards it; tower-http refuses a declared oversize body
/// and axum's extractor a streamed one, both with a plain 413; the handler is
/// never reached. The guard cannot tell a layer's 413 from a server that
/// started the request: the first `1` is left abandoned, and every later `1`
/// goes with a server-side id (the guard's own `max_body_bytes` is the limit
/// that frees ids).
#[tokio::test]
async fn body_limit_inside_the_guard() {
    let limit = 1024;
    let padded = padded_request(2 * limit);
    let layer = IdGuardLayer::new();
    let server = Server::start(|router| {
        stack_router(
            router,
            Order::GuardOutside,
            &layer,
            Duration::from_secs(60),
            limit,
        )
    })
    .await;
    let client = client();
    for body in [reqwest::Body::from(padded.clone()), streamed(&padded)] {
        let reply = send(&client, &server.url, body).await;
        assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_ne!(reply.content_type.as_deref(), Some("application/json"));
    }
    let small = send(&client, &server.url, streamed(&request_text("1", "x"))).await;
    assert_eq!(small.body, answer_text("1"), "a small streamed body passes");
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "only the small request reached the handler");
    server_side(&seen[0]);
    let stats = layer.stats();
    assert_eq!(
        (
            stats.passed_total,
            stats.remapped_total,
            stats.abandoned_ids
        ),
        (1, 2, 1),
        "{stats:?}"
    );
    assert_drained(&layer);
}

/// `GuardInside`: a declared oversize body gets tower-http's own 413 and
/// reaches neither the guard nor the handler. A streamed oversize body makes
/// the guard's read fail (`Limited` errors), so the guard answers its "body
/// could not be read" error: 400 and `-32600` with `id: null`, not 413. With
/// the guard's `max_body_bytes` well below the tower-http limit (by more than
/// a chunk, since `Limited` sees each chunk first) the guard answers the
/// streamed body with its own 413.
#[tokio::test]
async fn body_limit_outside_the_guard() {
    let limit = 1024;
    let padded = padded_request(2 * limit);
    let client = client();

    let layer = IdGuardLayer::new();
    let server = Server::start(|router| {
        stack_router(
            router,
            Order::GuardInside,
            &layer,
            Duration::from_secs(60),
            limit,
        )
    })
    .await;
    let declared = send(&client, &server.url, padded.clone()).await;
    assert_eq!(declared.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_ne!(declared.content_type.as_deref(), Some("application/json"));
    let streamed_reply = send(&client, &server.url, streamed(&padded)).await;
    assert_guard_error(&streamed_reply, StatusCode::BAD_REQUEST);
    let small = send(&client, &server.url, streamed(&request_text("1", "x"))).await;
    assert_eq!(small.body, answer_text("1"), "a small streamed body passes");
    assert_eq!(
        server.seen(),
        ["1"],
        "only the small request reached the handler"
    );
    assert_eq!(layer.stats().passed_total, 1);
    assert_drained(&layer);
    drop(server);

    let layer = IdGuardLayer::new().max_body_bytes(limit / 2);
    let server = Server::start(|router| {
        stack_router(
            router,
            Order::GuardInside,
            &layer,
            Duration::from_secs(60),
            limit,
        )
    })
    .await;
    let streamed_reply = send(&client, &server.url, streamed(&padded)).await;
    assert_guard_error(&streamed_reply, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(server.seen().is_empty());
    assert_drained(&layer);
}
