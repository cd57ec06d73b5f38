//! [`TraceService`]: continues or starts the trace of each POST, and hands
//! the upstream the guard's span as its parent.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::header::HeaderName;
use http::{Method, Request, Response};
use tower_service::Service;

use crate::guard::exchange::{WantsExchange, WantsRequestIds};
use crate::trace::legacy::body::TracedBody;
use crate::trace::legacy::context::{traceparent, TraceParent, TRACEPARENT, TRACESTATE};
use crate::trace::legacy::future::TraceFuture;
use crate::trace::legacy::span::{unix_nanos, OpenSpan, Started};
use crate::trace::legacy::tracer::Tracer;

/// The longest `MCP-Protocol-Version` recorded (revisions are dates).
const MAX_PROTOCOL: usize = 32;

/// The service [`TraceLayer`](crate::trace::legacy::TraceLayer) builds.
#[derive(Debug, Clone)]
pub struct TraceService<S> {
    inner: S,
    tracer: Option<Arc<Tracer>>,
}

impl<S> TraceService<S> {
    pub(crate) fn new(inner: S, tracer: Option<Arc<Tracer>>) -> Self {
        Self { inner, tracer }
    }

    inner_accessors!();
}

impl<S, B, R> Service<Request<B>> for TraceService<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    R: http_body::Body,
{
    type Response = Response<TracedBody<R>>;
    type Error = S::Error;
    type Future = TraceFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // Only a POST carries JSON-RPC messages; `GET` streams and `DELETE`
        // pass untouched.
        let Some(tracer) = self
            .tracer
            .as_ref()
            .filter(|_| request.method() == Method::POST)
        else {
            return TraceFuture::new(self.inner.call(request), None);
        };
        let arrived = Instant::now();
        let unix_nanos = unix_nanos();
        let headers = request.headers_mut();
        let parent = TraceParent::from_headers(headers);
        if parent.is_none() {
            // A new trace keeps nothing of an invalid or absent parent: its
            // vendor state belongs to another trace (W3C Trace Context).
            headers.remove(TRACESTATE);
        }
        let trace_id = parent.map_or_else(|| tracer.minter.trace_id(), |parent| parent.trace_id);
        let sampled = tracer.sampler.sampled(parent.as_ref(), &trace_id);
        let span_id = tracer.minter.span_id();
        // The upstream's spans are children of the guard's.
        headers.insert(
            HeaderName::from_static(TRACEPARENT),
            traceparent(&trace_id, &span_id, sampled),
        );
        if !sampled {
            return TraceFuture::new(self.inner.call(request), None);
        }
        let protocol = headers
            .get("mcp-protocol-version")
            .and_then(|value| value.to_str().ok())
            .filter(|value| {
                !value.is_empty()
                    && value.len() <= MAX_PROTOCOL
                    && value.bytes().all(|byte| byte.is_ascii_graphic())
            })
            .map(Box::from);
        let session = headers
            .get("mcp-session-id")
            .map(|session| tracer.minter.session_tag(session.as_bytes()));
        let started = Started {
            trace_id,
            span_id,
            parent_id: parent.map(|parent| parent.parent_id),
            flags: 1,
            protocol,
            session,
            unix_nanos,
            at: arrived,
        };
        // The guard inside leaves its account of the POST, with ids.
        request.extensions_mut().insert(WantsExchange);
        request.extensions_mut().insert(WantsRequestIds);
        let span = OpenSpan::new(Arc::clone(tracer), started);
        TraceFuture::new(self.inner.call(request), Some(span))
    }
}
