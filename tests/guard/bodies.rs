//! What the guard's request and response bodies carry through besides the
//! JSON-RPC text: a read request's trailers, and the size a watched answer
//! still has to deliver while the guard holds part of it back.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use futures::poll;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_id_guard::guard::GuardRequestBody as RequestBody;
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use tower::{Layer, ServiceExt};

use crate::support::ids::{id_text, is_server_side};
use crate::support::wait::{assert_drained, within};
use crate::tower_service::{json_response, post, read_response, request_text, spawn, SESSION};

/// A tracked POST's trailers reach the inner service after the body the
/// guard read, as the client sent them, whether its id went as it is or
/// remapped.
#[tokio::test]
async fn a_read_requests_trailers_reach_the_inner_service() {
    let (layer, mut service, mut handle) = spawn(OnDuplicate::Remap);
    handle.allow(2);
    let with_trailers = |id: &str| {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", "abc".parse().unwrap());
        let frames = vec![
            Ok::<_, Infallible>(Frame::data(Bytes::from(request_text(id)))),
            Ok(Frame::trailers(trailers)),
        ];
        post(StreamBody::new(futures::stream::iter(frames)).boxed_unsync())
    };
    // The first stays in flight, so the second is remapped.
    let mut pending = Vec::new();
    for _ in 0..2 {
        assert!(service.poll_ready().is_ready());
        let mut future = Box::pin(service.call(with_trailers("1")));
        assert!(poll!(future.as_mut()).is_pending());
        let (request, send) = within(handle.next_request()).await.unwrap();
        let collected = within(request.into_body().collect()).await.unwrap();
        let trailers = collected.trailers().cloned();
        let body = collected.to_bytes();
        assert_eq!(
            trailers
                .as_ref()
                .and_then(|trailers| trailers.get("x-checksum")),
            Some(&http::HeaderValue::from_static("abc")),
            "trailers of {body:?}"
        );
        pending.push((future, send, body));
    }
    assert!(
        is_server_side(&id_text(&pending[1].2)),
        "the second is remapped"
    );
    for (future, send, body) in pending {
        send.send_response(json_response(format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
            id_text(&body)
        )));
        read_response(within(future).await.unwrap()).await;
    }
    assert_drained(&layer);
}

/// A response body of known length that arrives in two pieces, the second
/// when the test sends it, and whose size hint is what is left of it, as
/// hyper's body of a response with a `Content-Length`.
struct TwoPieces {
    first: Option<Bytes>,
    rest: Option<futures::channel::oneshot::Receiver<Bytes>>,
    left: u64,
}

impl http_body::Body for TwoPieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let piece = match self.first.take() {
            Some(first) => first,
            None => match self.rest.as_mut() {
                Some(rest) => {
                    let piece = std::task::ready!(std::pin::Pin::new(rest).poll(cx))
                        .expect("the test sends the rest");
                    self.rest = None;
                    piece
                }
                None => return std::task::Poll::Ready(None),
            },
        };
        self.left -= piece.len() as u64;
        std::task::Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

/// While the guard holds back the first piece of a watched JSON answer
/// (until the body ends), the response's size hint still counts it: the
/// client is still to get every byte.
#[tokio::test]
async fn a_watched_answers_size_hint_counts_what_the_guard_holds_back() {
    const HEAD: &str = r#"{"jsonrpc":"2.0","id":1,"#;
    const TAIL: &str = r#""result":{}}"#;
    let layer = IdGuardLayer::new();
    let (send_rest, rest) = futures::channel::oneshot::channel();
    let rest = std::sync::Arc::new(std::sync::Mutex::new(Some(rest)));
    let service = layer.layer(tower::service_fn(
        move |_request: Request<RequestBody<Full<Bytes>>>| {
            let body = TwoPieces {
                first: Some(Bytes::from_static(HEAD.as_bytes())),
                rest: rest.lock().unwrap().take(),
                left: (HEAD.len() + TAIL.len()) as u64,
            };
            let response = Response::builder()
                .header("content-type", "application/json")
                .body(body)
                .unwrap();
            std::future::ready(Ok::<_, Infallible>(response))
        },
    ));
    let request = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("mcp-session-id", SESSION)
        .body(Full::new(Bytes::from(request_text("1"))))
        .unwrap();
    let response = within(service.oneshot(request)).await.unwrap();
    let mut body = Box::pin(response.into_body());
    let whole = (HEAD.len() + TAIL.len()) as u64;
    assert_eq!(http_body::Body::size_hint(&*body).exact(), Some(whole));
    assert!(
        poll!(body.frame()).is_pending(),
        "the first piece is held back until the body ends"
    );
    assert_eq!(
        http_body::Body::size_hint(&*body).exact(),
        Some(whole),
        "the held piece is still to come"
    );
    send_rest.send(Bytes::from_static(TAIL.as_bytes())).unwrap();
    let read = within(body.collect()).await.unwrap().to_bytes();
    assert_eq!(read, [HEAD, TAIL].concat().as_bytes());
    assert_drained(&layer);
}
