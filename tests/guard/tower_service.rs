//! `IdGuard` as a plain `tower::Service`, driven with `tower-test` mocks.
//!
//! These tests pin down the service contract (backpressure, which service
//! instance is called) and that a request's id registration is released on
//! every way an exchange can end: inner error, dropped response future,
//! dropped or finished response body, and a panic in the inner service. They
//! also check that remapped ids reach the inner service rewritten and come
//! back to the client byte for byte, in JSON and SSE responses.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::poll;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_id_guard::guard::{GuardRequestBody as RequestBody, GuardResponseBody as ResponseBody};
use mcp_id_guard::{IdGuard, IdGuardLayer, OnDuplicate};
use serde_json::value::RawValue;
use tower::{Layer, ServiceExt};
use tower_test::mock;

use crate::support::ids::{id_text, is_server_side};
use crate::support::wait::{assert_drained, within};

/// The client-side request body: any body, boxed, so one mock type serves
/// complete bodies and bodies streamed through a channel.
pub(super) type ReqBody = UnsyncBoxBody<Bytes, Infallible>;
/// What the mocked inner service receives.
pub(super) type InnerRequest = mcp_id_guard::inner::InnerRequest<ReqBody>;
/// What the mocked inner service answers.
pub(super) type InnerResponse = Response<Full<Bytes>>;
pub(super) type Handle = mock::Handle<InnerRequest, InnerResponse>;
pub(super) type Guarded = mock::Spawn<IdGuard<mock::Mock<InnerRequest, InnerResponse>>>;

pub(super) const SESSION: &str = "session-1";

pub(super) fn request_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo"}}}}"#)
}

fn full(body: impl Into<Bytes>) -> ReqBody {
    Full::new(body.into()).boxed_unsync()
}

/// A tracked POST: JSON, in `SESSION`.
pub(super) fn post(body: ReqBody) -> Request<ReqBody> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", SESSION)
        .body(body)
        .unwrap()
}

fn tracked(id: &str) -> Request<ReqBody> {
    post(full(request_text(id)))
}

/// A request body the test feeds chunk by chunk.
fn channel_body() -> (
    mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>,
    ReqBody,
) {
    let (sender, receiver) = mpsc::unbounded();
    (sender, StreamBody::new(receiver).boxed_unsync())
}

pub(super) fn spawn(policy: OnDuplicate) -> (IdGuardLayer, Guarded, Handle) {
    let layer = IdGuardLayer::new().on_duplicate(policy);
    let (service, handle) = mock::spawn_layer(layer.clone());
    (layer, service, handle)
}

async fn read_request(request: InnerRequest) -> Bytes {
    within(request.into_body().collect())
        .await
        .expect("infallible")
        .to_bytes()
}

pub(super) async fn read_response(response: Response<ResponseBody<Full<Bytes>>>) -> Bytes {
    within(response.into_body().collect())
        .await
        .expect("infallible")
        .to_bytes()
}

pub(super) fn json_response(body: String) -> InnerResponse {
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn in_flight(layer: &IdGuardLayer) -> usize {
    layer.stats().in_flight_requests
}

/// Readies the guard, calls it and waits until the mock receives the request.
async fn send_through(
    service: &mut Guarded,
    handle: &mut Handle,
    request: Request<ReqBody>,
) -> (
    impl Future<Output = Result<Response<ResponseBody<Full<Bytes>>>, tower::BoxError>>,
    mock::SendResponse<InnerResponse>,
    Bytes,
) {
    assert!(service.poll_ready().is_ready(), "the mock allows requests");
    let mut future = Box::pin(service.call(request));
    // The guard reads a tracked body inside the future, so it must be polled
    // before the inner service is called.
    assert!(poll!(future.as_mut()).is_pending());
    let (inner_request, send) = within(handle.next_request())
        .await
        .expect("the inner service was called");
    let body = read_request(inner_request).await;
    (future, send, body)
}

/// When the inner service is not ready the guard is not ready either; it is
/// woken and becomes ready when the inner service is.
#[tokio::test]
async fn poll_ready_follows_the_inner_service() {
    let (_layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    handle.allow(0);
    assert!(service.poll_ready().is_pending());
    assert!(!service.is_woken());
    handle.allow(1);
    assert!(
        service.is_woken(),
        "the inner service's wake-up reaches the caller"
    );
    assert!(matches!(
        service.poll_ready(),
        std::task::Poll::Ready(Ok(()))
    ));
}

/// An error from the inner service's `poll_ready` is passed through.
#[tokio::test]
async fn poll_ready_error_is_passed_through() {
    let (_layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    handle.send_error("inner not available");
    match service.poll_ready() {
        std::task::Poll::Ready(Err(error)) => {
            assert_eq!(error.to_string(), "inner not available")
        }
        other => panic!("expected the inner error, got {other:?}"),
    }
}

/// The service readied by `poll_ready` is the one called, also for a tracked
/// POST whose body is read before the inner call (a `tower-test` mock panics
/// when called without being ready), and the guard stays backpressured after
/// its one permitted request was used.
#[tokio::test]
async fn readied_service_is_called_for_tracked_and_untracked_requests() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let future = service.call(tracked("1"));
    let (response, request) = tokio::join!(within(future), async {
        let (request, send) = within(handle.next_request()).await.unwrap();
        let body = read_request(request).await;
        send.send_response(json_response(format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
            id_text(&body)
        )));
        body
    });
    assert_eq!(request, request_text("1").as_bytes());
    let response = response.expect("inner answered");
    assert_eq!(
        read_response(response).await,
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.as_bytes()
    );
    assert!(
        service.poll_ready().is_pending(),
        "the only permit was used by the call"
    );

    handle.allow(1);
    assert!(service.is_woken());
    assert!(service.poll_ready().is_ready());
    let untracked = Request::get("/mcp")
        .header("mcp-session-id", SESSION)
        .body(full(""))
        .unwrap();
    let future = service.call(untracked);
    let (response, method) = tokio::join!(within(future), async {
        let (request, send) = within(handle.next_request()).await.unwrap();
        send.send_response(Response::new(Full::default()));
        request.method().clone()
    });
    assert_eq!(method, http::Method::GET);
    assert_eq!(response.unwrap().status(), StatusCode::OK);
    assert_drained(&layer);
}

/// An error from the inner service releases the id: the counters drain, and
/// under `Reject` the same id is then accepted (not a duplicate). Whether the
/// server saw the failed request is unknown, so the id stays shadowed: the
/// reuse goes with a server-side id.
#[tokio::test]
async fn inner_error_releases_the_id() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Reject);
    let (future, send, _) = send_through(&mut service, &mut handle, tracked("7")).await;
    assert_eq!(in_flight(&layer), 1);
    send.send_error("inner failed");
    let error = within(future).await.expect_err("the inner error");
    assert_eq!(error.to_string(), "inner failed");
    assert_drained(&layer);

    assert_eq!(layer.stats().abandoned_ids, 1);

    let (future, send, body) = send_through(&mut service, &mut handle, tracked("7")).await;
    assert!(
        is_server_side(&id_text(&body)),
        "forwarded past the shadow: {}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(in_flight(&layer), 1);
    drop((future, send));
    let stats = layer.stats();
    assert_eq!(
        (
            stats.passed_total,
            stats.remapped_total,
            stats.rejected_total
        ),
        (1, 1, 0)
    );
    assert_drained(&layer);
}

/// A response future dropped while the request body is still being read
/// registers nothing, never calls the inner service, and leaves the id free.
#[tokio::test]
async fn future_dropped_while_reading_the_body_calls_nothing() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Reject);
    let (sender, body) = channel_body();
    let text = request_text("3");
    sender
        .unbounded_send(Ok(Frame::data(Bytes::copy_from_slice(
            &text.as_bytes()[..10],
        ))))
        .unwrap();
    assert!(service.poll_ready().is_ready());
    let mut future = Box::pin(service.call(post(body)));
    assert!(poll!(future.as_mut()).is_pending());
    assert_eq!(
        in_flight(&layer),
        0,
        "nothing registered before the body is read"
    );
    drop(future);
    assert!(
        handle.poll_request().is_pending(),
        "the inner service was not called"
    );
    assert!(
        sender
            .unbounded_send(Ok(Frame::data(Bytes::new())))
            .is_err(),
        "the request body was dropped with the future"
    );
    assert_drained(&layer);

    let (future, _send, body) = send_through(&mut service, &mut handle, tracked("3")).await;
    assert_eq!(body, text.as_bytes());
    drop(future);
    assert_eq!(layer.stats().rejected_total, 0);
    assert_drained(&layer);
}

/// A response future dropped while waiting for the inner service releases the
/// id at once.
#[tokio::test]
async fn future_dropped_while_waiting_for_the_inner_service_releases() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Reject);
    let (future, send, _) = send_through(&mut service, &mut handle, tracked("4")).await;
    assert_eq!(in_flight(&layer), 1);
    assert_eq!(layer.stats().in_flight_sessions, 1);
    drop(future);
    assert_drained(&layer);
    // The inner service answering late changes nothing.
    send.send_response(json_response(String::new()));
    assert_drained(&layer);

    let (future, _send, _) = send_through(&mut service, &mut handle, tracked("4")).await;
    assert_eq!(in_flight(&layer), 1, "the id was accepted again");
    drop(future);
    assert_eq!(layer.stats().rejected_total, 0);
}

/// A response body dropped before it was read releases the id.
#[tokio::test]
async fn response_body_dropped_early_releases() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Reject);
    let (future, send, _) = send_through(&mut service, &mut handle, tracked("5")).await;
    send.send_response(json_response(
        r#"{"jsonrpc":"2.0","id":5,"result":{}}"#.into(),
    ));
    let response = within(future).await.unwrap();
    assert_eq!(
        in_flight(&layer),
        1,
        "the registration moved into the response body"
    );
    drop(response);
    assert_drained(&layer);
}

/// A response body read to its end releases the id as soon as the end is
/// seen, before the body itself is dropped.
#[tokio::test]
async fn response_body_read_to_the_end_releases() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Reject);
    let (future, send, _) = send_through(&mut service, &mut handle, tracked("6")).await;
    let answer = r#"{"jsonrpc":"2.0","id":6,"result":{}}"#;
    send.send_response(json_response(answer.into()));
    let mut body = within(future).await.unwrap().into_body();
    let frame = within(body.frame()).await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), answer.as_bytes());
    assert!(within(body.frame()).await.is_none(), "end of body");
    assert_drained(&layer);
    drop(body);
    assert_drained(&layer);
}

async fn panicking_future(
    _request: Request<RequestBody<Full<Bytes>>>,
) -> Result<InnerResponse, Infallible> {
    panic!("inner service future panicked on purpose")
}

/// A panic inside the inner service's future unwinds through the guard's
/// future, whose registration is released: the task fails with a panic and
/// the counters drain.
#[tokio::test]
async fn panic_in_the_inner_future_releases() {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let service = layer.layer(tower::service_fn(panicking_future));
    let request = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("mcp-session-id", SESSION)
        .body(Full::new(Bytes::from(request_text("9"))))
        .unwrap();
    let task = tokio::spawn(service.oneshot(request));
    let error = within(task).await.expect_err("the task panicked");
    assert!(error.is_panic());
    assert_eq!(layer.stats().passed_total, 1, "the request was registered");
    assert_drained(&layer);
}

/// Like [`panic_in_the_inner_future_releases`], for an inner service whose
/// `call` itself panics (the guard calls it from inside its future).
#[tokio::test]
async fn panic_in_the_inner_call_releases() {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let service = layer.layer(tower::service_fn(
        |_request: Request<RequestBody<Full<Bytes>>>| -> std::future::Ready<Result<InnerResponse, Infallible>> {
            panic!("inner service call panicked on purpose")
        },
    ));
    let request = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("mcp-session-id", SESSION)
        .body(Full::new(Bytes::from(request_text("9"))))
        .unwrap();
    let task = tokio::spawn(service.oneshot(request));
    let error = within(task).await.expect_err("the task panicked");
    assert!(error.is_panic());
    assert_eq!(layer.stats().passed_total, 1, "the request was registered");
    assert_drained(&layer);
}

/// Under `Remap` a duplicate reaches the inner service with a rewritten id (a
/// JSON string in the reserved namespace), and an `application/json` answer
/// carrying that id comes back to the client with exactly its original id
/// text, while the first request keeps its own id.
#[tokio::test]
async fn remapped_id_is_restored_in_json_responses() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    let (first, first_send, first_body) =
        send_through(&mut service, &mut handle, tracked("1")).await;
    assert_eq!(first_body, request_text("1").as_bytes());

    let original = r#""\u0031""#; // the string "1", which collides with 1
    let (second, second_send, second_body) =
        send_through(&mut service, &mut handle, tracked(original)).await;
    let server_id = id_text(&second_body);
    let decoded: String = serde_json::from_str(&server_id).expect("a JSON string");
    assert!(decoded.starts_with("mcp-id-guard:"), "{decoded}");
    assert_eq!(
        second_body,
        request_text(&server_id).as_bytes(),
        "only the id changed"
    );
    assert_eq!(layer.stats().remapped_total, 1);

    second_send.send_response(json_response(format!(
        r#"{{"jsonrpc":"2.0","id":{server_id},"result":{{"content":[]}}}}"#
    )));
    let response = within(second).await.unwrap();
    assert!(response.headers().get("content-length").is_none());
    assert_eq!(
        read_response(response).await,
        format!(r#"{{"jsonrpc":"2.0","id":{original},"result":{{"content":[]}}}}"#).as_bytes()
    );

    first_send.send_response(json_response(
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.into(),
    ));
    let response = within(first).await.unwrap();
    assert_eq!(
        read_response(response).await,
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.as_bytes()
    );
    assert_drained(&layer);
}

/// The same through `text/event-stream`: the response event's id is restored,
/// the priming event, event ids and notifications pass unchanged.
#[tokio::test]
async fn remapped_id_is_restored_in_sse_responses() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    let (_first, _first_send, _) = send_through(&mut service, &mut handle, tracked("1")).await;
    let (second, second_send, second_body) =
        send_through(&mut service, &mut handle, tracked("1")).await;
    let server_id = id_text(&second_body);
    assert!(server_id.starts_with("\"mcp-id-guard:"), "{server_id}");

    let stream = |id: &str| {
        format!(
            "id: 0\ndata:\n\n\
             id: 1\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"progressToken\":{server_id}}}}}\n\n\
             id: 2\ndata: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{}}}}\n\n"
        )
    };
    second_send.send_response(
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Full::new(Bytes::from(stream(&server_id))))
            .unwrap(),
    );
    let response = within(second).await.unwrap();
    assert_eq!(
        read_response(response).await,
        stream("1").as_bytes(),
        "only the response's top-level id is restored"
    );
    assert_eq!(in_flight(&layer), 1, "the first request is still in flight");
}

fn cancellation(request_id: &str) -> Request<ReqBody> {
    post(full(format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{request_id},"reason":"user"}}}}"#
    )))
}

/// The `requestId` of a forwarded `notifications/cancelled`, as JSON text.
fn cancelled_id(body: &[u8]) -> String {
    let message: BTreeMap<String, Box<RawValue>> =
        serde_json::from_slice(body).expect("a JSON object");
    let params: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(message["params"].get()).expect("params");
    params["requestId"].get().to_owned()
}

/// Sends a cancellation through the guard and returns the body the inner
/// service received; the inner service acknowledges it with 202.
async fn send_cancellation(service: &mut Guarded, handle: &mut Handle, request_id: &str) -> Bytes {
    let (future, send, body) = send_through(service, handle, cancellation(request_id)).await;
    send.send_response(
        Response::builder()
            .status(StatusCode::ACCEPTED)
            .body(Full::default())
            .unwrap(),
    );
    let response = within(future).await.unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    body
}

/// `notifications/cancelled` names requests by the client's id; the guard
/// forwards it naming the request the way the inner service knows it: the
/// oldest in-flight request with that id first (forwarded as is), then the
/// remapped duplicate (its server-side id). Cancelled exchanges stay counted
/// in flight until they end.
#[tokio::test]
async fn cancellation_names_the_request_as_the_inner_service_knows_it() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    let (first, _first_send, _) = send_through(&mut service, &mut handle, tracked("1")).await;
    let (second, _second_send, second_body) =
        send_through(&mut service, &mut handle, tracked("1")).await;
    let server_id = id_text(&second_body);
    assert!(server_id.starts_with("\"mcp-id-guard:"), "{server_id}");

    let body = send_cancellation(&mut service, &mut handle, "1").await;
    assert_eq!(
        cancelled_id(&body),
        "1",
        "the oldest, known by the client's id"
    );
    let body = send_cancellation(&mut service, &mut handle, "1").await;
    assert_eq!(cancelled_id(&body), server_id, "then the remapped one");
    let body = send_cancellation(&mut service, &mut handle, "1").await;
    assert_eq!(cancelled_id(&body), "1", "nothing left: passes unchanged");

    let stats = layer.stats();
    assert_eq!(stats.cancelled_total, 2);
    assert_eq!(stats.in_flight_requests, 2, "both exchanges are still open");
    drop((first, second));
    assert_drained(&layer);
}

/// A cancelled request whose exchange is still open may still be running in
/// the inner service and answer under its id: the spec lets a receiver ignore
/// `notifications/cancelled` (and the Python SDK answers a cancelled request
/// with an error response carrying its id). So while that exchange is open,
/// a new request with the same id must not reach the inner service under
/// that id, or the two cross-wire exactly as without the guard. Under `Remap`
/// it should be remapped; the guard instead frees the id at the cancellation
/// and forwards the new request as is.
#[tokio::test]
async fn cancelled_but_open_exchange_keeps_its_id_from_the_inner_service() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    let (_first, _first_send, first_body) =
        send_through(&mut service, &mut handle, tracked("1")).await;
    assert_eq!(id_text(&first_body), "1");
    send_cancellation(&mut service, &mut handle, "1").await;
    assert_eq!(
        layer.stats().in_flight_requests,
        1,
        "the first is still open"
    );

    let (_second, _second_send, second_body) =
        send_through(&mut service, &mut handle, tracked("1")).await;
    let seen = id_text(&second_body);
    assert_ne!(
        seen, "1",
        "the inner service now has two requests with id 1 in flight"
    );
}

/// A response body the test feeds event by event.
type SseBody = StreamBody<mpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>>;

/// Once the client has received the response to its request, the id is
/// free for reuse (spec: ids must not match a request "not yet received a
/// response for"; sequential reuse must stay allowed), even if the server
/// keeps the SSE stream open a little longer (it only SHOULD close it after
/// the response). The guard releases the id at the end of the body, so under
/// `Reject` a client that reuses the id as soon as it has read the response
/// event is rejected until the server closes the stream.
#[tokio::test]
async fn id_is_free_once_the_response_event_was_delivered() {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let (mut service, mut handle) =
        mock::spawn_layer::<InnerRequest, Response<SseBody>, _>(layer.clone());
    assert!(service.poll_ready().is_ready());
    let mut first = Box::pin(service.call(tracked("1")));
    assert!(poll!(first.as_mut()).is_pending());
    let (_request, send) = within(handle.next_request()).await.unwrap();
    let (events, body) = mpsc::unbounded();
    send.send_response(
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(StreamBody::new(body))
            .unwrap(),
    );
    let mut body = within(first).await.unwrap().into_body();
    let event = "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n";
    events
        .unbounded_send(Ok(Frame::data(Bytes::from_static(event.as_bytes()))))
        .unwrap();
    // The event may come in several frames (bytes go on as they arrive).
    let mut received = Vec::new();
    while received.len() < event.len() {
        let frame = within(body.frame()).await.unwrap().unwrap();
        received.extend_from_slice(&frame.into_data().unwrap());
    }
    assert_eq!(received, event.as_bytes());
    // The client has its response; the stream is still open.

    assert!(service.poll_ready().is_ready());
    let mut second = Box::pin(service.call(tracked("1")));
    assert!(
        poll!(second.as_mut()).is_pending(),
        "the reuse was answered by the guard itself: {:?}",
        layer.stats()
    );
    assert_eq!(layer.stats().rejected_total, 0);
    drop((events, body));
}

/// The crate docs say a cancellation goes to the oldest in-flight request
/// with the id because "it is the one the server knows by the client's own
/// id (later duplicates were remapped), so the server sees exactly the
/// cancellation it would have seen without the guard". That premise fails
/// once the first request has ended: with `1` (as is) and a remapped `1` in
/// flight, the first ends and a third `1` goes as is; the server now knows
/// that third request by `1`, yet the guard cancels the remapped one.
#[tokio::test]
async fn cancellation_names_the_request_the_server_knows_by_the_clients_id() {
    let (_layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    let (first, first_send, _) = send_through(&mut service, &mut handle, tracked("1")).await;
    let (_second, _second_send, second_body) =
        send_through(&mut service, &mut handle, tracked("1")).await;
    assert!(id_text(&second_body).starts_with("\"mcp-id-guard:"));
    first_send.send_response(json_response(
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.into(),
    ));
    read_response(within(first).await.unwrap()).await;
    let (_third, _third_send, third_body) =
        send_through(&mut service, &mut handle, tracked("1")).await;
    assert_eq!(id_text(&third_body), "1", "the server knows the third by 1");

    let body = send_cancellation(&mut service, &mut handle, "1").await;
    assert_eq!(
        cancelled_id(&body),
        "1",
        "an unguarded server would have cancelled the request it knows by 1"
    );
}

/// A request abandoned under the client's id (its future dropped) and a
/// live one remapped past it share id 1. A cancellation of 1 goes to the
/// live request, which the client waits for; naming the abandoned one would
/// leave the live one running and holding the id, so that under `Reject` the
/// client's next request 1 would be refused.
#[tokio::test]
async fn cancellation_names_the_live_request_before_an_abandoned_one() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Reject);
    let (first, _first_send, _) = send_through(&mut service, &mut handle, tracked("1")).await;
    drop(first);
    assert_eq!(layer.stats().abandoned_ids, 1);
    let (_second, _second_send, second_body) =
        send_through(&mut service, &mut handle, tracked("1")).await;
    let server_id = id_text(&second_body);
    assert!(is_server_side(&server_id), "{server_id}");

    let body = send_cancellation(&mut service, &mut handle, "1").await;
    assert_eq!(
        cancelled_id(&body),
        server_id,
        "the live request, as the server knows it"
    );

    assert!(service.poll_ready().is_ready());
    let mut third = Box::pin(service.call(tracked("1")));
    assert!(
        poll!(third.as_mut()).is_pending(),
        "the reuse was answered by the guard itself: {:?}",
        layer.stats()
    );
    let (third_request, _third_send) = within(handle.next_request()).await.unwrap();
    let third_id = id_text(&read_request(third_request).await);
    assert!(is_server_side(&third_id), "still shadowed: {third_id}");
    assert_eq!(layer.stats().rejected_total, 0);
}
