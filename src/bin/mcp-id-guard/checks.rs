//! Today's per-request checks in front of the guard: the request head's size
//! (431) and the Host/Origin policy (421/403), each answer marked with its
//! [`Refused`] kind for the metrics. Stand-in until the library's own
//! protection layers replace them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use mcp_id_guard::protect::Refused;
use mcp_id_guard::proxy::{HostPolicy, ProxyBody};
use pin_project::pin_project;
use tower_layer::Layer;
use tower_service::Service;

/// The answers of the checks.
type RefusalBody = Either<ProxyBody, Full<Bytes>>;

#[derive(Debug, Clone)]
pub(crate) struct ChecksLayer {
    pub(crate) hosts: Arc<HostPolicy>,
    pub(crate) max_header_bytes: Option<usize>,
}

impl<S> Layer<S> for ChecksLayer {
    type Service = Checks<S>;

    fn layer(&self, inner: S) -> Checks<S> {
        Checks {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Checks<S> {
    inner: S,
    layer: ChecksLayer,
}

impl<S, B, R> Service<Request<B>> for Checks<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<Either<R, RefusalBody>>;
    type Error = S::Error;
    type Future = Checked<S::Future, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let too_large = self
            .layer
            .max_header_bytes
            .filter(|max| head_size(&request) > *max);
        // Checked before the guard reads anything: a rebound page's request
        // never reaches the upstream.
        let (mut response, kind) = if let Some(max) = too_large {
            (header_too_large(max).map(Either::Right), Refused::HeadSize)
        } else {
            match self.layer.hosts.check(&request) {
                Ok(()) => return Checked::Passed(self.inner.call(request)),
                Err(refusal) if refusal.status() == StatusCode::FORBIDDEN => {
                    (refusal.into_response().map(Either::Left), Refused::Origin)
                }
                Err(refusal) => (refusal.into_response().map(Either::Left), Refused::Host),
            }
        };
        response.extensions_mut().insert(kind);
        Checked::Refused(Some(response.map(Either::Right)))
    }
}

#[pin_project(project = CheckedProj)]
pub(crate) enum Checked<F, R> {
    Passed(#[pin] F),
    Refused(Option<Response<Either<R, RefusalBody>>>),
}

impl<F, R, E> Future for Checked<F, R>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<Either<R, RefusalBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CheckedProj::Passed(future) => future
                .poll(cx)
                .map(|result| result.map(|response| response.map(Either::Left))),
            CheckedProj::Refused(response) => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
        }
    }
}

/// The size of a request head as HTTP/1.1 sends it: request line, and each
/// header as `name: value` and a line break.
fn head_size<B>(request: &Request<B>) -> usize {
    let uri = request.uri();
    let target = uri
        .path_and_query()
        .map_or(1, |target| target.as_str().len())
        + uri
            .authority()
            .map_or(0, |authority| authority.as_str().len());
    let line = request.method().as_str().len() + target + 12;
    request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + line
}

/// `431` with a JSON-RPC error (the body has not been read: `id` null).
fn header_too_large(max: usize) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32600,
            "message": format!("Invalid Request: request headers exceed the limit of {max} bytes"),
        },
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
