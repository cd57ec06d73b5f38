//! The shared budget under slow bodies: what a client can hold of it, and
//! what is left for small bodies while it does.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::StreamExt as _;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt as _, Full};
use tower::ServiceExt as _;
use tower_layer::Layer as _;
use tower_service::Service;

use crate::protect::buffer::{BodyBudget, BodyBufferLayer};

/// A body whose frames the test sends, announcing `length` bytes (a
/// `Content-Length`) when there is one.
struct Fed {
    frames: mpsc::UnboundedReceiver<Bytes>,
    length: Option<u64>,
}

/// A body fed by hand, and the sender that feeds it.
fn fed(length: Option<u64>) -> (mpsc::UnboundedSender<Bytes>, Fed) {
    let (send, frames) = mpsc::unbounded();
    (send, Fed { frames, length })
}

impl Body for Fed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.frames
            .poll_next_unpin(cx)
            .map(|frame| frame.map(|data| Ok(Frame::data(data))))
    }

    fn size_hint(&self) -> SizeHint {
        self.length
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// The inner service: answers with the body it got.
fn echo() -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(|request: Request<Full<Bytes>>| async move {
        let body = request.into_body().collect().await?.to_bytes();
        Ok::<_, Infallible>(Response::new(Full::new(body)))
    })
}

/// A response future of the layer, boxed.
type Answer<'a> = Pin<
    Box<
        dyn Future<
                Output = Result<Response<crate::protect::ProtectedBody<Full<Bytes>>>, Infallible>,
            > + 'a,
    >,
>;

/// Sends `body` on a connection of its own (a service `layer` made).
fn post<B>(layer: &BodyBufferLayer, body: B) -> Answer<'static>
where
    B: Body<Data = Bytes> + 'static,
{
    let connection = layer.layer(echo());
    let request = Request::post("/mcp").body(body).unwrap();
    Box::pin(connection.oneshot(request))
}

/// A 40-byte ping on a connection of its own: its status, bounded in time.
async fn ping(layer: &BodyBufferLayer) -> u16 {
    let body = Full::new(Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    ));
    let answer = tokio::time::timeout(Duration::from_secs(5), post(layer, body))
        .await
        .expect("a ping is answered at once")
        .unwrap();
    answer.status().as_u16()
}

/// Bodies held open, each with the sender that would feed it more.
type Held = Vec<(mpsc::UnboundedSender<Bytes>, Answer<'static>)>;

/// Opens `count` slow bodies on `layer`, each announcing `length` and
/// sending `sent` bytes: the ones held (still being read), and how many
/// were refused with `503` at once.
async fn slow_bodies(
    layer: &BodyBufferLayer,
    count: usize,
    length: Option<u64>,
    sent: usize,
) -> (Held, usize) {
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..count {
        let (send, body) = fed(length);
        send.unbounded_send(Bytes::from(vec![b' '; sent])).unwrap();
        let mut answer = post(layer, body);
        match futures::poll!(&mut answer) {
            Poll::Pending => held.push((send, answer)),
            Poll::Ready(answer) => {
                assert_eq!(answer.unwrap().status(), 503);
                refused += 1;
            }
        }
    }
    (held, refused)
}

/// The attack: slow bodies that announce large lengths and send a few
/// bytes. Reserving each announced length up front, 2 of them held the
/// whole 1 MiB budget and every small body got 503; counting what arrived,
/// all 8 are held (a few bytes each) and small bodies pass.
#[tokio::test]
async fn slow_bodies_announcing_large_lengths_do_not_lock_out_small_ones() {
    let budget = BodyBudget::new(1024 * 1024);
    let layer = BodyBufferLayer::new(budget.clone());
    let mut slow = Vec::new();
    for _ in 0..8 {
        let (send, body) = fed(Some(512 * 1024));
        send.unbounded_send(Bytes::from_static(&[b' '; 250]))
            .unwrap();
        let mut answer = post(&layer, body);
        let pending = futures::poll!(&mut answer).is_pending();
        slow.push((send, answer, pending));
    }
    let pings: Vec<u16> = futures::future::join_all((0..10).map(|_| ping(&layer))).await;
    assert_eq!(
        pings,
        [200; 10],
        "small bodies while 8 slow ones are held ({} bytes held)",
        budget.used()
    );
    let held = slow.iter().filter(|(_, _, pending)| *pending).count();
    assert_eq!(held, 8, "every slow body is held, not refused");
    assert!(budget.used() <= 8 * 500, "{} bytes held", budget.used());
    drop(slow);
    assert_eq!(budget.used(), 0, "given back when the bodies are dropped");
}

/// Slow bodies that do send their bytes fill the budget up to its reserve
/// for small bodies, no further: the large body that would take the last of
/// it is refused, and small bodies still pass.
#[tokio::test]
async fn small_bodies_keep_a_reserve_large_bodies_cannot_take() {
    let budget = BodyBudget::new(1024 * 1024);
    let layer = BodyBufferLayer::new(budget.clone());
    let (slow, refused) = slow_bodies(&layer, 4, None, 256 * 1024).await;
    let pings: Vec<u16> = futures::future::join_all((0..10).map(|_| ping(&layer))).await;
    assert_eq!(
        pings,
        [200; 10],
        "small bodies while large ones hold {} bytes",
        budget.used()
    );
    assert_eq!(
        (slow.len(), refused),
        (3, 1),
        "the fourth would take the reserve"
    );
    drop(slow);
    assert_eq!(budget.used(), 0);
}

/// The large bodies of one client address count together, across its
/// connections, against the address's share; another address has its own;
/// small bodies from the address that filled its share still pass.
#[tokio::test]
async fn one_client_address_holds_at_most_its_share() {
    let budget = BodyBudget::new(1024 * 1024).per_client(300 * 1024);
    let layer = BodyBufferLayer::new(budget.clone());
    let attacker = layer.for_client("192.0.2.1".parse().unwrap());
    let mut slow = Vec::new();
    let mut statuses = Vec::new();
    for client in [
        &attacker,
        &attacker,
        &layer.for_client("192.0.2.2".parse().unwrap()),
    ] {
        let (send, body) = fed(None);
        send.unbounded_send(Bytes::from(vec![b' '; 200 * 1024]))
            .unwrap();
        let mut answer = post(client, body);
        match futures::poll!(&mut answer) {
            Poll::Pending => {
                statuses.push(0);
                slow.push((send, answer));
            }
            Poll::Ready(answer) => statuses.push(answer.unwrap().status().as_u16()),
        }
    }
    assert_eq!(
        statuses,
        [0, 503, 0],
        "held, over the address's share, another address's"
    );
    assert_eq!(budget.used(), 400 * 1024);
    let pings: Vec<u16> = futures::future::join_all((0..10).map(|_| ping(&attacker))).await;
    assert_eq!(pings, [200; 10], "small bodies are not the share's");
    drop(slow);
    assert_eq!((budget.used(), budget.bodies()), (0, 0));
}

/// Slow bodies that stay small (64 KiB each, the small size, of the 512 KiB
/// they announce) cannot take the reserve either: it is for small bodies
/// whose bytes have all arrived, which the server can answer at once.
/// Before, sixteen such bodies held the whole 1 MiB and every ping got 503;
/// now they stop short of the reserve and pings pass.
#[tokio::test]
async fn slow_small_bodies_cannot_take_the_reserve() {
    let budget = BodyBudget::new(1024 * 1024);
    let layer = BodyBufferLayer::new(budget.clone());
    let (slow, refused) = slow_bodies(&layer, 16, Some(512 * 1024), 64 * 1024).await;
    let pings: Vec<u16> = futures::future::join_all((0..10).map(|_| ping(&layer))).await;
    assert_eq!(
        pings,
        [200; 10],
        "small bodies while slow small ones hold {} bytes",
        budget.used()
    );
    assert_eq!((slow.len(), refused), (14, 2), "the reserve is not theirs");
    drop(slow);
    assert_eq!((budget.used(), budget.bodies()), (0, 0));
}

/// One address's slow bodies count against its share whatever their size:
/// small ones (60 KiB each, still arriving) too. Before, bodies of at most
/// the small size never counted, and one address holding a thousand of
/// them took the whole budget; now it holds its share, another address's
/// large body still fits, and pings pass.
#[tokio::test]
async fn one_address_cannot_hold_more_than_its_share_in_small_bodies() {
    let budget = BodyBudget::new(1024 * 1024).per_client(256 * 1024);
    let layer = BodyBufferLayer::new(budget.clone());
    let attacker = layer.for_client("192.0.2.1".parse().unwrap());
    let (slow, refused) = slow_bodies(&attacker, 16, Some(512 * 1024), 60 * 1024).await;
    assert_eq!(
        (slow.len(), refused),
        (4, 12),
        "4 x 64 KiB charged fill 256 KiB"
    );
    let other = layer.for_client("192.0.2.2".parse().unwrap());
    let (send, body) = fed(None);
    send.unbounded_send(Bytes::from(vec![b' '; 200 * 1024]))
        .unwrap();
    let mut large = post(&other, body);
    assert!(
        futures::poll!(&mut large).is_pending(),
        "another address's body fits"
    );
    let pings: Vec<u16> = futures::future::join_all((0..10).map(|_| ping(&attacker))).await;
    assert_eq!(
        pings, [200; 10],
        "complete small bodies are not the share's"
    );
    drop((slow, send, large));
    assert_eq!((budget.used(), budget.bodies()), (0, 0));
}
