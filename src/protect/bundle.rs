//! [`ProtectLayer`]: the three request protections in the recommended order,
//! as one layer with one response body.
//!
//! Stacked by hand, [`HeadLimitLayer`], [`HostLayer`] and [`BodyPaceLayer`]
//! each wrap the response body, and every type error names
//! `ProtectedBody<ProtectedBody<ProtectedBody<…>>>`. The bundle composes the
//! very same three services (their logic is not repeated here) and unwraps
//! the two outer bodies, so its response body is one [`ProtectedBody`].

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use http_body::Body;
use pin_project::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::ProtectedBody;
use super::future::ProtectedFuture;
use super::head::{HeadLimit, HeadLimitLayer};
use super::host::{HostCheck, HostLayer, HostPolicy};
use super::pace::{BodyPace, BodyPaceLayer, PaceFuture, PacedBody};

/// The request head limit of [`ProtectLayer::new`], in bytes: what the
/// `mcp-id-guard` binary allows by default (nginx allows about as much).
const DEFAULT_MAX_HEAD_BYTES: usize = 32 * 1024;

/// The protections every MCP server facing the network wants, in the
/// recommended order, cheapest first: the request head's size
/// ([`HeadLimitLayer`], `431`), its `Host` and `Origin` ([`HostLayer`],
/// `421`/`403`), the request body's pace ([`BodyPaceLayer`], `408`). Wraps a
/// service in [`Protect`]; put it outside
/// [`IdGuardLayer`](crate::IdGuardLayer), so a request it refuses is never
/// read.
///
/// Each protection is set with its own layer's builder; the defaults are a
/// 32 KiB head, the policy given, and [`BodyPaceLayer::new`]'s pace.
///
/// ```
/// use std::time::Duration;
/// use mcp_id_guard::protect::head::HeadLimitLayer;
/// use mcp_id_guard::protect::host::HostPolicy;
/// use mcp_id_guard::protect::pace::BodyPaceLayer;
/// use mcp_id_guard::protect::ProtectLayer;
/// use mcp_id_guard::IdGuardLayer;
/// use tower::ServiceBuilder;
///
/// let layers = ServiceBuilder::new()
///     .layer(
///         ProtectLayer::new(HostPolicy::loopback())
///             .head_limit(HeadLimitLayer::new(16 * 1024))
///             .body_pace(BodyPaceLayer::new().idle_timeout(Some(Duration::from_secs(10)))),
///     )
///     .layer(IdGuardLayer::new());
/// # let _ = layers;
/// ```
#[derive(Debug, Clone)]
pub struct ProtectLayer {
    head: HeadLimitLayer,
    host: HostLayer,
    pace: BodyPaceLayer,
}

/// [`ProtectLayer::new`] with [`HostPolicy::loopback`].
impl Default for ProtectLayer {
    fn default() -> Self {
        Self::new(HostPolicy::loopback())
    }
}

impl ProtectLayer {
    /// The three protections with their defaults, serving the `Host` and
    /// `Origin` values `policy` allows.
    pub fn new(policy: HostPolicy) -> Self {
        Self {
            head: HeadLimitLayer::new(DEFAULT_MAX_HEAD_BYTES),
            host: HostLayer::new(policy),
            pace: BodyPaceLayer::new(),
        }
    }

    /// Sets the request head limit (default 32 KiB).
    pub fn head_limit(mut self, head: HeadLimitLayer) -> Self {
        self.head = head;
        self
    }

    /// Sets the request body's pace (default [`BodyPaceLayer::new`]).
    pub fn body_pace(mut self, pace: BodyPaceLayer) -> Self {
        self.pace = pace;
        self
    }

    /// The `Host` and `Origin` policy it applies.
    pub fn policy(&self) -> &HostPolicy {
        self.host.policy()
    }
}

impl<S> Layer<S> for ProtectLayer {
    type Service = Protect<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Protect {
            inner: self.head.layer(self.host.layer(self.pace.layer(inner))),
        }
    }
}

/// The three protections of [`ProtectLayer`] around a service: the inner
/// service receives the request with its body in a [`PacedBody`], and its
/// response body comes back in one [`ProtectedBody`].
#[derive(Debug, Clone)]
pub struct Protect<S> {
    inner: HeadLimit<HostCheck<BodyPace<S>>>,
}

impl<S> Protect<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref().get_ref().get_ref()
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut().get_mut().get_mut()
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner.into_inner().into_inner().into_inner()
    }
}

impl<S, B, ResBody> Service<Request<B>> for Protect<S>
where
    S: Service<Request<PacedBody<B>>, Response = Response<ResBody>>,
    B: Body,
{
    type Response = Response<ProtectedBody<ResBody>>;
    type Error = S::Error;
    type Future = ProtectFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        ProtectFuture {
            inner: self.inner.call(request),
        }
    }
}

/// The response future of [`Protect`]: the inner service's response, or the
/// refusal of whichever protection refused the request.
#[pin_project]
#[derive(Debug)]
pub struct ProtectFuture<F> {
    #[pin]
    inner: ProtectedFuture<ProtectedFuture<PaceFuture<F>>>,
}

impl<F, B, E> Future for ProtectFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ProtectedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = ready!(self.project().inner.poll(cx))?;
        Poll::Ready(Ok(
            response.map(|body| ProtectedBody::flatten(ProtectedBody::flatten(body)))
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::{BodyExt as _, Full, StreamBody};
    use tower::ServiceExt as _;

    use super::*;
    use crate::protect::Refused;

    type Silent = StreamBody<futures::stream::Pending<Result<Frame<Bytes>, Infallible>>>;

    /// An inner service that reads the whole body, then answers `200` with
    /// `served` (or `400` when the body failed).
    fn protected<B>(
        layer: &ProtectLayer,
    ) -> impl Service<Request<B>, Response = Response<ProtectedBody<Full<Bytes>>>, Error = Infallible>
           + Clone
    where
        B: Body<Data = Bytes> + Send + 'static,
        PacedBody<B>: Body<Data = Bytes>,
    {
        layer.layer(tower::service_fn(
            |request: Request<PacedBody<B>>| async move {
                let status = match request.into_body().collect().await {
                    Ok(_) => 200,
                    Err(_) => 400,
                };
                let mut response = Response::new(Full::from("served"));
                *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
                Ok::<_, Infallible>(response)
            },
        ))
    }

    fn post(host: &str, padding: usize) -> Request<Full<Bytes>> {
        Request::post("/mcp")
            .header("host", host)
            .header("x-padding", "a".repeat(padding))
            .body(Full::from("{}"))
            .unwrap()
    }

    async fn outcome(
        response: Response<ProtectedBody<Full<Bytes>>>,
    ) -> (u16, Option<Refused>, Bytes) {
        let status = response.status().as_u16();
        let refused = response.extensions().get::<Refused>().copied();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, refused, body)
    }

    #[tokio::test]
    async fn the_bundle_refuses_as_the_three_layers_in_order_with_one_body() {
        let layer = ProtectLayer::new(HostPolicy::loopback()).head_limit(HeadLimitLayer::new(1024));
        let service = protected::<Full<Bytes>>(&layer);

        let (status, refused, body) = outcome(
            service
                .clone()
                .oneshot(post("localhost:8000", 0))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!((status, refused, &body[..]), (200, None, &b"served"[..]));

        let (status, refused, _) = outcome(
            service
                .clone()
                .oneshot(post("evil.example:8000", 0))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!((status, refused), (421, Some(Refused::Host)));

        // Over the head limit and from a rebound page: the head is checked
        // first (the cheapest check, before the Host policy).
        let (status, refused, body) = outcome(
            service
                .oneshot(post("evil.example:8000", 2000))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!((status, refused), (431, Some(Refused::HeadSize)));
        let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(error["error"]["code"], -32600);
    }

    #[tokio::test]
    async fn the_bundle_holds_the_body_to_its_pace() {
        let layer = ProtectLayer::default()
            .body_pace(BodyPaceLayer::new().idle_timeout(Some(Duration::from_millis(50))));
        let silent: Silent = StreamBody::new(futures::stream::pending());
        let request = Request::post("/mcp")
            .header("host", "127.0.0.1:8000")
            .body(silent)
            .unwrap();
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            protected::<Silent>(&layer).oneshot(request),
        )
        .await
        .expect("the pace answers within its idle timeout")
        .unwrap();
        let (status, refused, _) = outcome(response).await;
        assert_eq!((status, refused), (408, Some(Refused::BodyIdle)));
    }
}
