//! What frees an id: only the server's answer to it, seen passing to the
//! client (and, last, how a restored answer leaves: in no more frames than
//! it came in). An answer the guard did not see the server give (a layer's status
//! code inside the guard, a replay of another request's answer on a resumed
//! stream) frees nothing, and an answer the guard can read (an
//! `identity`-encoded body, a stream led by a byte order mark) is read.
//!
//! The inner service is a `tower-test` mock whose response bodies are
//! channels, so a stream stays open while the test reuses an id.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::poll;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_id_guard::guard::{GuardRequestBody as RequestBody, GuardResponseBody as ResponseBody};
use mcp_id_guard::inner::Unanswered;
use mcp_id_guard::{IdGuard, IdGuardLayer, OnDuplicate};
use tower_test::mock;

use crate::support::ids::{id_text, is_server_side};
use crate::support::wait::within;

type Chunks = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;
type InnerBody = StreamBody<mpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>>;
type InnerRequest = Request<RequestBody<Full<Bytes>>>;
type Guarded = mock::Spawn<IdGuard<mock::Mock<InnerRequest, Response<InnerBody>>>>;
type Handle = mock::Handle<InnerRequest, Response<InnerBody>>;
type GuardResponse = Response<ResponseBody<InnerBody>>;

const SESSION: &str = "session-answered";

fn call_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"slow"}}}}"#)
}

fn answer_text(id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
}

fn tracked(id: &str) -> Request<Full<Bytes>> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", SESSION)
        .body(Full::new(Bytes::from(call_text(id))))
        .unwrap()
}

/// A `GET` of the session, resuming from `last_event_id`.
fn resume(last_event_id: &str) -> Request<Full<Bytes>> {
    Request::get("/mcp")
        .header("accept", "text/event-stream")
        .header("mcp-session-id", SESSION)
        .header("last-event-id", last_event_id)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn spawn(layer: IdGuardLayer) -> (Guarded, Handle) {
    mock::spawn_layer(layer)
}

/// Calls the guard until the mock has the request; returns the response
/// future, the mock's responder and the id the inner service saw (`None`
/// for a body without one).
async fn send(
    service: &mut Guarded,
    handle: &mut Handle,
    request: Request<Full<Bytes>>,
) -> (
    impl Future<Output = Result<GuardResponse, tower::BoxError>>,
    mock::SendResponse<Response<InnerBody>>,
    Option<String>,
) {
    assert!(service.poll_ready().is_ready());
    let mut future = Box::pin(service.call(request));
    // The guard reads a tracked body inside the future.
    assert!(poll!(future.as_mut()).is_pending());
    let (inner, send) = within(handle.next_request())
        .await
        .expect("the inner service was called");
    let body = within(inner.into_body().collect())
        .await
        .expect("infallible")
        .to_bytes();
    let id = (!body.is_empty()).then(|| id_text(&body));
    (future, send, id)
}

/// A response whose body the test feeds.
fn streamed(status: StatusCode, headers: &[(&str, &str)]) -> (Response<InnerBody>, Chunks) {
    let (chunks, receiver) = mpsc::unbounded();
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    (builder.body(StreamBody::new(receiver)).unwrap(), chunks)
}

fn feed(chunks: &Chunks, text: &str) {
    chunks
        .unbounded_send(Ok(Frame::data(Bytes::copy_from_slice(text.as_bytes()))))
        .unwrap();
}

/// Reads what the guard lets through until it has `len` bytes.
async fn read_exactly(body: &mut ResponseBody<InnerBody>, len: usize) -> String {
    let mut read = Vec::new();
    while read.len() < len {
        let frame = within(body.frame())
            .await
            .expect("the body goes on")
            .expect("infallible");
        read.extend_from_slice(&frame.into_data().expect("data"));
    }
    String::from_utf8(read).unwrap()
}

/// Reads the body to its end.
async fn read_all(body: ResponseBody<InnerBody>) -> String {
    let bytes = within(body.collect()).await.expect("infallible").to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Sends `1` and checks how the inner service saw it: as is when the id was
/// free, remapped when it is still abandoned. Answers it so it ends.
async fn reuse_is_remapped(service: &mut Guarded, handle: &mut Handle) -> bool {
    let (future, send, seen) = send(service, handle, tracked("1")).await;
    let seen = seen.expect("an id");
    let (response, chunks) = streamed(StatusCode::OK, &[("content-type", "application/json")]);
    send.send_response(response);
    feed(&chunks, &answer_text(&seen));
    drop(chunks);
    let body = within(future).await.unwrap().into_body();
    assert_eq!(read_all(body).await, answer_text("1"), "its own answer");
    is_server_side(&seen)
}

/// A case: the status, headers and body the inner service answers with,
/// the mark it puts on the answer, and whether the id stays abandoned.
type Case = (
    StatusCode,
    &'static [(&'static str, &'static str)],
    &'static str,
    Option<Unanswered>,
    bool,
);

/// A status code from a layer inside the guard (a timeout's `408`, a body
/// limit's `413`, a `5xx`) is no answer from the server, which may have
/// started the request and keeps running it under the client's id: the id
/// stays abandoned, and the next `1` goes with a server-side id. So is a
/// gateway's `502`/`503`/`504`, even with a JSON-RPC error carrying the id.
/// The server's own refusal carrying the id, or a stand-in marked
/// `Unanswered::NotSent`, frees it.
#[tokio::test]
async fn a_status_without_the_servers_answer_frees_nothing() {
    let cases: [Case; 8] = [
        (StatusCode::REQUEST_TIMEOUT, &[], "", None, true),
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            &[("content-type", "text/plain")],
            "length limit exceeded",
            None,
            true,
        ),
        (StatusCode::NOT_FOUND, &[], "", None, true),
        (StatusCode::BAD_GATEWAY, &[], "", None, true),
        // A gateway's stand-in, even one carrying a JSON-RPC error with the
        // id (what a proxy in front of the server answers when it gives
        // up): no answer from the server. Its in-process mark does not
        // cross HTTP.
        (
            StatusCode::GATEWAY_TIMEOUT,
            &[("content-type", "application/json")],
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"upstream timed out"}}"#,
            None,
            true,
        ),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            &[("content-type", "application/json")],
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"busy"}}"#,
            None,
            true,
        ),
        // The server's own refusal, with the id: answered.
        (
            StatusCode::BAD_REQUEST,
            &[("content-type", "application/json")],
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"no"}}"#,
            None,
            false,
        ),
        // A forwarder that knows the request never left.
        (
            StatusCode::SERVICE_UNAVAILABLE,
            &[],
            "",
            Some(Unanswered::NotSent),
            false,
        ),
    ];
    for (status, headers, body, mark, abandoned) in cases {
        let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
        let (mut service, mut handle) = spawn(layer.clone());
        let (future, send, seen) = send(&mut service, &mut handle, tracked("1")).await;
        assert_eq!(seen.as_deref(), Some("1"));
        let (mut response, chunks) = streamed(status, headers);
        if let Some(mark) = mark {
            response.extensions_mut().insert(mark);
        }
        send.send_response(response);
        if !body.is_empty() {
            feed(&chunks, body);
        }
        drop(chunks);
        let response = within(future).await.unwrap();
        assert_eq!(response.status(), status);
        assert_eq!(read_all(response.into_body()).await, body, "{status}");
        assert_eq!(
            layer.stats().abandoned_ids,
            usize::from(abandoned),
            "{status} {mark:?}"
        );
        assert_eq!(
            reuse_is_remapped(&mut service, &mut handle).await,
            abandoned,
            "{status} {mark:?}: the next 1"
        );
        assert_eq!(layer.stats().rejected_total, 0, "never refused");
    }
}

/// SEP-1699 polling with one id: A (`1`) is answered on its own stream; B
/// (`1`) is primed and its stream closed before its answer, so B is
/// abandoned. A `GET` resuming A's stream replays A's old answer: that is no
/// answer to B, whose id stays abandoned, so C (`1`) goes with a server-side
/// id while B still runs. A `GET` resuming B's own stream, replaying B's
/// answer, frees the id: D (`1`) goes as is.
#[tokio::test]
async fn a_replayed_answer_frees_only_the_request_whose_stream_it_resumes() {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Remap);
    let (mut service, mut handle) = spawn(layer.clone());
    let sse = [("content-type", "text/event-stream")];

    // A: primed, answered, the stream ends.
    let (a, a_send, seen) = send(&mut service, &mut handle, tracked("1")).await;
    assert_eq!(seen.as_deref(), Some("1"));
    let (response, a_chunks) = streamed(StatusCode::OK, &sse);
    a_send.send_response(response);
    let a_stream = format!("id: a-0\ndata:\n\nid: a-1\ndata: {}\n\n", answer_text("1"));
    feed(&a_chunks, &a_stream);
    drop(a_chunks);
    assert_eq!(
        read_all(within(a).await.unwrap().into_body()).await,
        a_stream
    );

    // B: primed, then closed for polling.
    let (b, b_send, seen) = send(&mut service, &mut handle, tracked("1")).await;
    assert_eq!(seen.as_deref(), Some("1"), "A was answered: 1 is free");
    let (response, b_chunks) = streamed(StatusCode::OK, &sse);
    b_send.send_response(response);
    feed(&b_chunks, "id: b-0\nretry: 10\ndata:\n\n");
    drop(b_chunks);
    read_all(within(b).await.unwrap().into_body()).await;
    assert_eq!(layer.stats().abandoned_ids, 1, "B may still be running");

    // The client resumes A's stream; the server replays A's answer.
    for (last_event_id, replay, frees) in [
        (
            "a-0",
            format!("id: a-1\ndata: {}\n\n", answer_text("1")),
            false,
        ),
        (
            "b-0",
            format!("id: b-1\ndata: {}\n\n", answer_text("1")),
            true,
        ),
    ] {
        let (get, get_send, _) = send(&mut service, &mut handle, resume(last_event_id)).await;
        let (response, chunks) = streamed(StatusCode::OK, &sse);
        get_send.send_response(response);
        feed(&chunks, &replay);
        let mut body = within(get).await.unwrap().into_body();
        assert_eq!(read_exactly(&mut body, replay.len()).await, replay);
        assert_eq!(
            layer.stats().abandoned_ids,
            usize::from(!frees),
            "resumed from {last_event_id}"
        );
        assert_eq!(
            reuse_is_remapped(&mut service, &mut handle).await,
            !frees,
            "resumed from {last_event_id}: the next 1"
        );
        drop((chunks, body));
    }
}

/// `Content-Encoding: identity` is no compression (as the guard already
/// reads it on requests): a remapped answer carrying it comes back with the
/// client's id, in JSON and in SSE.
#[tokio::test]
async fn an_identity_encoded_answer_is_restored() {
    for content_type in ["application/json", "text/event-stream"] {
        let layer = IdGuardLayer::new();
        let (mut service, mut handle) = spawn(layer.clone());
        let (_first, _first_send, _) = send(&mut service, &mut handle, tracked("1")).await;
        let (second, send, seen) = send(&mut service, &mut handle, tracked("1")).await;
        let server_id = seen.unwrap();
        assert!(is_server_side(&server_id));
        let (response, chunks) = streamed(
            StatusCode::OK,
            &[
                ("content-type", content_type),
                ("content-encoding", " Identity "),
            ],
        );
        send.send_response(response);
        let wire = |id: &str| {
            if content_type == "application/json" {
                answer_text(id)
            } else {
                format!("id: 1\ndata: {}\n\n", answer_text(id))
            }
        };
        feed(&chunks, &wire(&server_id));
        drop(chunks);
        let body = within(second).await.unwrap().into_body();
        assert_eq!(read_all(body).await, wire("1"), "{content_type}");
        assert_eq!(layer.stats().restored_total, 1, "{content_type}");
    }
}

/// A byte order mark at the start of an event stream is dropped by the SSE
/// decoder: the first event is a `data` event like any other. Its answer
/// frees the id as soon as it passed (the stream stays open), and a remapped
/// one is restored.
#[tokio::test]
async fn an_answer_in_a_stream_led_by_a_byte_order_mark_counts() {
    let layer = IdGuardLayer::new();
    let (mut service, mut handle) = spawn(layer.clone());
    let sse = [("content-type", "text/event-stream")];
    let (first, first_send, seen) = send(&mut service, &mut handle, tracked("1")).await;
    assert_eq!(seen.as_deref(), Some("1"));
    let (response, first_chunks) = streamed(StatusCode::OK, &sse);
    first_send.send_response(response);
    let event = format!("\u{feff}data: {}\n\n", answer_text("1"));
    feed(&first_chunks, &event);
    let mut first_body = within(first).await.unwrap().into_body();
    assert_eq!(read_exactly(&mut first_body, event.len()).await, event);
    // The stream is still open, and its answer passed: 1 is free.
    assert_eq!(layer.stats().in_flight_requests, 0);

    let (second, second_send, seen) = send(&mut service, &mut handle, tracked("1")).await;
    assert_eq!(seen.as_deref(), Some("1"), "the answer freed 1");
    // A third `1` while the second runs: remapped, answered behind a mark.
    let (third, third_send, seen) = send(&mut service, &mut handle, tracked("1")).await;
    let server_id = seen.unwrap();
    assert!(is_server_side(&server_id));
    let (response, third_chunks) = streamed(StatusCode::OK, &sse);
    third_send.send_response(response);
    feed(
        &third_chunks,
        &format!("\u{feff}data: {}\n\n", answer_text(&server_id)),
    );
    drop(third_chunks);
    let third_body = within(third).await.unwrap().into_body();
    assert_eq!(read_all(third_body).await, event, "restored");
    drop((first_chunks, first_body, second, second_send));
}

/// An `abandoned_id_ttl` too long for the clock to add remembers the id:
/// it must not come out as "forget it at once".
#[tokio::test]
async fn a_ttl_past_the_clock_remembers_the_abandoned_id() {
    let layer = IdGuardLayer::new().abandoned_id_ttl(Duration::MAX);
    let (mut service, mut handle) = spawn(layer.clone());
    let (future, send, _) = send(&mut service, &mut handle, tracked("1")).await;
    let (response, chunks) = streamed(StatusCode::OK, &[("content-type", "text/event-stream")]);
    send.send_response(response);
    drop(chunks); // the stream ends before the answer
    read_all(within(future).await.unwrap().into_body()).await;
    assert_eq!(layer.stats().abandoned_ids, 1);
    assert!(reuse_is_remapped(&mut service, &mut handle).await);
}

/// A JSON answer led by a UTF-8 byte order mark: `fetch` decodes the body
/// as UTF-8, which drops the mark, so a browser or Node client reads the
/// JSON after it. The guard reads it there too: a remapped answer is
/// restored (the mark passes on) and the id is free, however the body is
/// chunked.
#[tokio::test]
async fn a_json_answer_led_by_a_byte_order_mark_counts() {
    for cut in [0, 1, 2, 3, 5] {
        let layer = IdGuardLayer::new();
        let (mut service, mut handle) = spawn(layer.clone());
        let (_first, _first_send, _) = send(&mut service, &mut handle, tracked("1")).await;
        let (second, send, seen) = send(&mut service, &mut handle, tracked("1")).await;
        let server_id = seen.unwrap();
        let (response, chunks) = streamed(StatusCode::OK, &[("content-type", "application/json")]);
        send.send_response(response);
        let wire = format!("\u{feff}{}", answer_text(&server_id)).into_bytes();
        for part in [&wire[..cut], &wire[cut..]] {
            chunks
                .unbounded_send(Ok(Frame::data(Bytes::copy_from_slice(part))))
                .unwrap();
        }
        drop(chunks);
        let body = within(second).await.unwrap().into_body();
        assert_eq!(
            read_all(body).await,
            format!("\u{feff}{}", answer_text("1")),
            "cut {cut}"
        );
        assert_eq!(layer.stats().restored_total, 1, "cut {cut}");
        assert_eq!(layer.stats().in_flight_requests, 1, "cut {cut}: the first");
    }
}

/// A `Content-Encoding` that names no coding (an empty list, `identity`
/// twice) leaves the body as it is: the answer is read and restored. One
/// that names a coding leaves it unread.
#[tokio::test]
async fn a_content_encoding_list_of_identity_is_read() {
    for (encoding, restored) in [
        ("", true),
        ("identity, IDENTITY", true),
        (" , identity", true),
        ("identity, gzip", false),
        ("br", false),
    ] {
        let layer = IdGuardLayer::new();
        let (mut service, mut handle) = spawn(layer.clone());
        let (_first, _first_send, _) = send(&mut service, &mut handle, tracked("1")).await;
        let (second, send, seen) = send(&mut service, &mut handle, tracked("1")).await;
        let server_id = seen.unwrap();
        let (response, chunks) = streamed(
            StatusCode::OK,
            &[
                ("content-type", "application/json"),
                ("content-encoding", encoding),
            ],
        );
        send.send_response(response);
        feed(&chunks, &answer_text(&server_id));
        drop(chunks);
        let body = within(second).await.unwrap().into_body();
        let expected = answer_text(if restored { "1" } else { &server_id });
        assert_eq!(read_all(body).await, expected, "{encoding:?}");
    }
}

/// SEP-1699 polling where the server closes resumed streams too: the client
/// resumes A's stream, gets one more event and the stream closes again, so
/// it resumes from that event's id; the answer comes on that second (and a
/// third) resumption. The tie follows the stream: the answer frees A, and a
/// replay of A's answer on a resumption of another stream frees nothing.
/// Before, only a `GET` naming the POST's own last event id counted, and A's
/// id stayed abandoned for the whole TTL (every reuse remapped).
#[tokio::test]
async fn an_answer_on_any_resumption_of_the_stream_frees_its_request() {
    for resumptions in [2, 3] {
        let layer = IdGuardLayer::new();
        let (mut service, mut handle) = spawn(layer.clone());
        let sse = [("content-type", "text/event-stream")];
        // A: primed, then closed for polling.
        let (a, a_send, _) = send(&mut service, &mut handle, tracked("1")).await;
        let (response, a_chunks) = streamed(StatusCode::OK, &sse);
        a_send.send_response(response);
        feed(
            &a_chunks,
            "id: a-0
retry: 10
data:

",
        );
        drop(a_chunks);
        read_all(within(a).await.unwrap().into_body()).await;
        assert_eq!(layer.stats().abandoned_ids, 1);

        // Resumptions closed early, each after one more event (a progress
        // notification), then the one that carries the answer.
        let mut last = "a-0".to_owned();
        for round in 1..resumptions {
            let (get, get_send, _) = send(&mut service, &mut handle, resume(&last)).await;
            let (response, chunks) = streamed(StatusCode::OK, &sse);
            get_send.send_response(response);
            let event = format!(
                "id: a-{round}\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{}}}}\n\n"
            );
            feed(&chunks, &event);
            drop(chunks);
            assert_eq!(
                read_all(within(get).await.unwrap().into_body()).await,
                event
            );
            assert_eq!(layer.stats().abandoned_ids, 1, "no answer yet");
            last = format!("a-{round}");
        }
        // A resumption of another stream replaying an answer with id 1 frees
        // nothing.
        let (get, get_send, _) = send(&mut service, &mut handle, resume("other-7")).await;
        let (response, chunks) = streamed(StatusCode::OK, &sse);
        get_send.send_response(response);
        let replay = format!("id: other-8\ndata: {}\n\n", answer_text("1"));
        feed(&chunks, &replay);
        drop(chunks);
        assert_eq!(
            read_all(within(get).await.unwrap().into_body()).await,
            replay
        );
        assert_eq!(layer.stats().abandoned_ids, 1, "another stream's answer");

        let (get, get_send, _) = send(&mut service, &mut handle, resume(&last)).await;
        let (response, chunks) = streamed(StatusCode::OK, &sse);
        get_send.send_response(response);
        let answer = format!("id: a-9\ndata: {}\n\n", answer_text("1"));
        feed(&chunks, &answer);
        let mut body = within(get).await.unwrap().into_body();
        assert_eq!(read_exactly(&mut body, answer.len()).await, answer);
        assert_eq!(
            layer.stats().abandoned_ids,
            0,
            "answered on resumption {resumptions}"
        );
        assert!(
            !reuse_is_remapped(&mut service, &mut handle).await,
            "1 is free again"
        );
        drop((chunks, body));
    }
}

/// A resume can overtake the end of the request's own exchange (an HTTP/1
/// disconnect the server notices first, a proxy in between still holding
/// the POST): the server moves the stream to the `GET` and the answer passes
/// there before the POST's end. The id is free once the POST ends at the
/// event the `GET` resumed from; a POST that ends at another event leaves
/// it abandoned.
#[tokio::test]
async fn an_answer_on_a_resume_that_overtakes_the_posts_end_counts() {
    for (post_tail, frees) in [("", true), ("id: a-1\ndata:\n\n", false)] {
        let layer = IdGuardLayer::new();
        let (mut service, mut handle) = spawn(layer.clone());
        let sse = [("content-type", "text/event-stream")];
        let (post, post_send, _) = send(&mut service, &mut handle, tracked("1")).await;
        let (response, post_chunks) = streamed(StatusCode::OK, &sse);
        post_send.send_response(response);
        let priming = "id: a-0\ndata:\n\n";
        feed(&post_chunks, priming);
        let mut post_body = within(post).await.unwrap().into_body();
        assert_eq!(read_exactly(&mut post_body, priming.len()).await, priming);

        let (get, get_send, _) = send(&mut service, &mut handle, resume("a-0")).await;
        let (response, get_chunks) = streamed(StatusCode::OK, &sse);
        get_send.send_response(response);
        let answer = format!("id: a-2\ndata: {}\n\n", answer_text("1"));
        feed(&get_chunks, &answer);
        let mut get_body = within(get).await.unwrap().into_body();
        assert_eq!(read_exactly(&mut get_body, answer.len()).await, answer);

        // The POST ends now, at a-0 or after another event.
        if !post_tail.is_empty() {
            feed(&post_chunks, post_tail);
        }
        drop(post_chunks);
        read_all(post_body).await;
        assert_eq!(
            layer.stats().abandoned_ids,
            usize::from(!frees),
            "POST tail {post_tail:?}"
        );
        assert_eq!(
            reuse_is_remapped(&mut service, &mut handle).await,
            !frees,
            "POST tail {post_tail:?}"
        );
        drop((get_chunks, get_body));
    }
}

/// A batch of 200 `1`s (all but the first remapped) answered by one JSON
/// array in 4 KiB chunks, and the same answers as SSE events: every id comes
/// back as the client sent it, in no more frames than the server sent (each
/// frame is an HTTP/1 chunk or an HTTP/2 DATA frame; restoring splices each
/// chunk into pieces around the ids it rewrites, which used to leave as one
/// frame each: 381 323 chunks for an 8 MiB answer).
#[tokio::test]
async fn a_restored_answer_leaves_in_no_more_frames_than_it_came() {
    const REQUESTS: usize = 200;
    for sse in [false, true] {
        let layer = IdGuardLayer::new();
        let (mut service, mut handle) = spawn(layer.clone());
        let batch = format!("[{}]", vec![call_text("1"); REQUESTS].join(","));
        let request = Request::post("/mcp")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", SESSION)
            .body(Full::new(Bytes::from(batch)))
            .unwrap();
        assert!(service.poll_ready().is_ready());
        let mut future = Box::pin(service.call(request));
        assert!(poll!(future.as_mut()).is_pending());
        let (inner, send) = within(handle.next_request()).await.unwrap();
        let body = within(inner.into_body().collect())
            .await
            .unwrap()
            .to_bytes();
        let sent: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
        let answers: Vec<String> = sent
            .iter()
            .map(|request| answer_text(&request["id"].to_string()))
            .collect();
        assert!(answers
            .iter()
            .skip(1)
            .all(|answer| answer.contains("mcp-id-guard:")));
        let (wire, expected) = if sse {
            let events = |answers: &[String]| -> String {
                answers
                    .iter()
                    .map(|answer| format!("data: {answer}\n\n"))
                    .collect()
            };
            let mine = vec![answer_text("1"); REQUESTS];
            (events(&answers), events(&mine))
        } else {
            (
                format!("[{}]", answers.join(",")),
                format!("[{}]", vec![answer_text("1"); REQUESTS].join(",")),
            )
        };
        let content_type = if sse {
            "text/event-stream"
        } else {
            "application/json"
        };
        let (response, chunks) = streamed(StatusCode::OK, &[("content-type", content_type)]);
        send.send_response(response);
        let mut sent_frames = 0;
        for chunk in wire.as_bytes().chunks(4096) {
            chunks
                .unbounded_send(Ok(Frame::data(Bytes::copy_from_slice(chunk))))
                .unwrap();
            sent_frames += 1;
        }
        drop(chunks);
        let mut body = within(future).await.unwrap().into_body();
        let (mut frames, mut read) = (0, Vec::new());
        while let Some(frame) = within(body.frame()).await {
            read.extend_from_slice(&frame.unwrap().into_data().unwrap());
            frames += 1;
        }
        assert_eq!(String::from_utf8(read).unwrap(), expected, "sse {sse}");
        assert!(
            frames <= sent_frames + 1,
            "sse {sse}: {frames} frames out for {sent_frames} in"
        );
    }
}
