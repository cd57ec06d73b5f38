use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body::Body;
use http_body_util::Full;
use tower_service::Service;

use super::budget::{Charge, Counter, Over, Shared};
use super::future::BufferFuture;

/// Reads each request body whole (counted against the budgets) before
/// calling the inner service with it. Made by
/// [`BodyBufferLayer`](super::BodyBufferLayer); see the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct BodyBuffer<S> {
    inner: S,
    shared: Arc<Shared>,
    /// The share of the connection's client address, if bounded.
    client: Option<Arc<Counter>>,
    connection: Arc<Counter>,
    max_body_bytes: usize,
}

impl<S> BodyBuffer<S> {
    pub(super) fn new(
        inner: S,
        shared: Arc<Shared>,
        (client, connection): (Option<Arc<Counter>>, Arc<Counter>),
        max_body_bytes: usize,
    ) -> Self {
        Self {
            inner,
            shared,
            client,
            connection,
            max_body_bytes,
        }
    }

    inner_accessors!();
}

impl<S, B, ResBody> Service<Request<B>> for BodyBuffer<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone,
    B: Body<Data = Bytes>,
{
    type Response = Response<crate::protect::body::ProtectedBody<ResBody>>;
    type Error = S::Error;
    type Future = BufferFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (parts, body) = request.into_parts();
        // HTTP/2 has no `Connection` header: a refused stream ends alone.
        let close = parts.version < Version::HTTP_2;
        if body.is_end_stream() {
            let request = Request::from_parts(parts, Full::default());
            return BufferFuture::called(self.inner.call(request), None);
        }
        // A `Content-Length` over the cap is refused unread. What it
        // announces is never held for up front: a body is charged for what
        // has arrived of it (see the module docs).
        let bytes = |bytes: u64| usize::try_from(bytes).unwrap_or(usize::MAX);
        let hint = body.size_hint();
        let announced = hint.upper().map_or(usize::MAX, bytes);
        if bytes(hint.lower()) > self.max_body_bytes {
            return BufferFuture::refused(Over::Size, self.max_body_bytes, close);
        }
        let shares = (self.client.clone(), Some(Arc::clone(&self.connection)));
        let charge = Charge::new(shares, Arc::clone(&self.shared));
        // The inner service made ready is the one called once the body is
        // complete; this one stays for the next request.
        let ready = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, ready);
        BufferFuture::reading(
            (parts, body),
            service,
            charge,
            (announced.min(self.max_body_bytes), hint.exact().map(bytes)),
            self.max_body_bytes,
            close,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures::channel::mpsc;
    use futures::StreamExt as _;
    use http_body::Frame;
    use http_body_util::{BodyExt as _, StreamBody};
    use tower::ServiceExt;
    use tower_layer::Layer as _;

    use super::*;
    use crate::protect::buffer::{BodyBudget, BodyBufferLayer};
    use crate::protect::Refused;

    type Streamed = StreamBody<
        futures::stream::Map<
            mpsc::UnboundedReceiver<Bytes>,
            fn(Bytes) -> Result<Frame<Bytes>, Infallible>,
        >,
    >;

    /// A body without a length whose frames the test sends.
    fn streamed() -> (mpsc::UnboundedSender<Bytes>, Streamed) {
        let (send, frames) = mpsc::unbounded();
        let frame: fn(Bytes) -> Result<Frame<Bytes>, Infallible> = |bytes| Ok(Frame::data(bytes));
        (send, StreamBody::new(frames.map(frame)))
    }

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

    /// The streams of one connection (one service the layer made) count
    /// together against its share; another connection has its own share of
    /// the shared budget; bytes are given back when a request is done.
    #[tokio::test]
    async fn the_streams_of_one_connection_share_its_budget() {
        let budget = BodyBudget::new(1 << 20);
        let layer = BodyBufferLayer::new(budget.clone()).per_connection(1000);
        let mut connection = layer.layer(echo());

        let (first_send, first_body) = streamed();
        first_send
            .unbounded_send(Bytes::from(vec![b'a'; 600]))
            .unwrap();
        let request = Request::post("/mcp").body(first_body).unwrap();
        let mut first = Box::pin(
            ServiceExt::<Request<Streamed>>::ready(&mut connection)
                .await
                .unwrap()
                .call(request),
        );
        assert!(futures::poll!(&mut first).is_pending());
        assert_eq!(budget.used(), 600);

        let (second_send, second_body) = streamed();
        second_send
            .unbounded_send(Bytes::from(vec![b'b'; 600]))
            .unwrap();
        let request = Request::post("/mcp").body(second_body).unwrap();
        let second = ServiceExt::<Request<Streamed>>::ready(&mut connection)
            .await
            .unwrap()
            .call(request)
            .await
            .unwrap();
        assert_eq!(second.status(), 503);
        assert_eq!(
            second.extensions().get::<Refused>(),
            Some(&Refused::BodyBudget)
        );
        assert_eq!(budget.used(), 600, "the refused stream holds nothing");

        let mut other = layer.layer(echo());
        let (other_send, other_body) = streamed();
        other_send
            .unbounded_send(Bytes::from(vec![b'c'; 600]))
            .unwrap();
        drop(other_send);
        let request = Request::post("/mcp").body(other_body).unwrap();
        let answered = ServiceExt::<Request<Streamed>>::ready(&mut other)
            .await
            .unwrap()
            .call(request)
            .await
            .unwrap();
        assert_eq!(answered.status(), 200, "another connection, its own share");

        drop(first_send);
        let first = first.await.unwrap();
        assert_eq!(
            first.into_body().collect().await.unwrap().to_bytes().len(),
            600
        );
        assert_eq!(budget.used(), 0);
    }
}
