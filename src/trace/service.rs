//! [`McpTrace`]: opens the span of each POST, continuing the client's
//! trace, and hands the upstream the guard's span as its parent.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use tower_service::Service;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::guard::exchange::{DecisionSpan, WantsExchange, WantsRequestIds};
use crate::table::SessionTag;
use crate::trace::body::TracedBody;
use crate::trace::future::TraceFuture;
use crate::trace::propagation::{self, continues, TRACEPARENT, TRACESTATE};
use crate::trace::span::{describe, new_span, OpenSpan, Started};

/// Once per process: a client's `traceparent` arrived and the subscriber has
/// no tracing-opentelemetry layer of the guard's version to continue it in.
/// Everything still runs, and every guard span becomes a trace of its own:
/// the one sign of a version mismatch, so it names the versions.
pub(crate) fn warn_no_layer() {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "a client's traceparent cannot be continued: the tracing subscriber has no \
             tracing-opentelemetry 0.34 layer (opentelemetry 0.33), so the guard's spans are \
             not in the client's trace; build the layer from \
             mcp_id_guard::trace::tracing_opentelemetry (once per process)"
        );
    }
}

/// The longest `MCP-Protocol-Version` recorded (revisions are dates).
const MAX_PROTOCOL: usize = 32;

/// The service [`McpTraceLayer`](crate::trace::McpTraceLayer) builds.
#[derive(Debug, Clone)]
pub struct McpTrace<S> {
    inner: S,
    enabled: bool,
}

impl<S> McpTrace<S> {
    pub(crate) fn new(inner: S, enabled: bool) -> Self {
        Self { inner, enabled }
    }

    inner_accessors!();
}

impl<S, B, R> Service<Request<B>> for McpTrace<S>
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
        if !self.enabled || request.method() != Method::POST {
            return TraceFuture::new(self.inner.call(request), None);
        }
        let span = new_span();
        if span.is_disabled() {
            // No subscriber wants it: the request goes on as it came.
            return TraceFuture::new(self.inner.call(request), None);
        }
        let headers = request.headers_mut();
        let outer = Span::current();
        let client = propagation::extract(headers);
        // A new trace keeps nothing of an invalid or absent parent: its
        // vendor state belongs to another trace (W3C Trace Context).
        if client.is_none() {
            headers.remove(TRACEPARENT);
            headers.remove(TRACESTATE);
        }
        // The client's span is the parent, unless the application's request
        // span (tower-http's, made by `request_span`) already continues the
        // client's trace: then the guard's span is that span's child, as it
        // opened, and the trace reads client, application, guard.
        let client = client.filter(|client| !continues(&outer, client));
        if let Some(client) = &client {
            if let Err(tracing_opentelemetry::SetParentError::LayerNotFound) =
                span.set_parent(client.clone())
            {
                warn_no_layer();
            }
        }
        // The upstream's spans are children of the guard's (sampled or not:
        // the flag tells), and the client's `tracestate` goes on with it.
        // Without tracing-opentelemetry the context has no span and nothing
        // is written.
        propagation::inject(&span.context(), headers);
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
            .map(|session| SessionTag::of(session.as_bytes()));
        let started = Started {
            client,
            outer: (!outer.is_none()).then_some(outer),
            protocol,
            session,
        };
        started.note(&span);
        // The guard inside leaves its account of the POST, with ids, and
        // describes the first message on the span as soon as it decides;
        // a trace layer outside this one keeps that for its own span, and
        // this one describes its span as it closes.
        request.extensions_mut().insert(WantsExchange);
        let decision = (request.extensions().get::<WantsRequestIds>().is_none()).then(|| {
            let decision = DecisionSpan::new(span.clone(), describe);
            request
                .extensions_mut()
                .insert(WantsRequestIds(Arc::clone(&decision)));
            decision
        });
        let span = OpenSpan::new(span, started, decision);
        TraceFuture::new(self.inner.call(request), Some(span))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tower::{Service as _, ServiceBuilder, ServiceExt as _};
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;
    use crate::IdGuardLayer;

    /// The trace layer's handle on its span never reaches the server, read
    /// or not: a server that kept it would keep the span open.
    #[tokio::test]
    async fn the_span_handle_stays_with_the_guard() {
        let subscriber = tracing_subscriber::registry().with(tracing_subscriber::fmt::layer());
        let _default = tracing::subscriber::set_default(subscriber);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let inner = {
            let seen = Arc::clone(&seen);
            tower::service_fn(move |request: Request<_>| {
                let seen = Arc::clone(&seen);
                async move {
                    let leaked = request.extensions().get::<WantsRequestIds>().is_some();
                    seen.lock().expect("not poisoned").push(leaked);
                    Ok::<_, std::convert::Infallible>(Response::new(String::new()))
                }
            })
        };
        let mut service = ServiceBuilder::new()
            .layer(crate::trace::McpTraceLayer::new())
            .layer(IdGuardLayer::new())
            .service(inner);
        let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#;
        for session in [Some("s"), None] {
            let mut request = Request::post("/mcp").header("content-type", "application/json");
            if let Some(session) = session {
                request = request.header("mcp-session-id", session);
            }
            let request = request
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    call.as_bytes(),
                )))
                .expect("a request");
            let ready = service.ready().await.expect("ready");
            let _ = ready.call(request).await.expect("answered");
        }
        assert_eq!(*seen.lock().expect("not poisoned"), [false, false]);
    }
}
