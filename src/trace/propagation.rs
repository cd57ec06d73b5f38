//! W3C Trace Context through OpenTelemetry's own propagator
//! ([`TraceContextPropagator`]): the adaptors between it and an
//! [`http::HeaderMap`], which are all this crate writes.
//!
//! Not `opentelemetry-http`'s `HeaderExtractor`: it reads the first of
//! several `traceparent` headers, where W3C Trace Context says a request
//! with several is invalid (a vendor cannot tell which one counts); and
//! its `HeaderInjector` would also write an empty `tracestate`.

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The W3C header that carries the caller's span.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The vendor state that travels with it.
pub(crate) const TRACESTATE: &str = "tracestate";

/// The client's span context, when its request carries exactly one valid
/// `traceparent` (as the propagator reads it); `None` otherwise.
pub(crate) fn extract(headers: &HeaderMap) -> Option<Context> {
    let context = TraceContextPropagator::new().extract(&Strict(headers));
    context.span().span_context().is_valid().then_some(context)
}

/// The trace context a handler continues: the guard's span for this
/// request, which [`McpTraceLayer`](crate::trace::McpTraceLayer) wrote into
/// its `traceparent`. An rmcp tool takes the request's parts as
/// `Extension<http::request::Parts>`; one line makes its span a child of the
/// guard's, in the client's trace. Empty (a new trace) when the request
/// carries no valid `traceparent`.
///
/// ```
/// use mcp_id_guard::trace::parent_context;
/// use mcp_id_guard::trace::opentelemetry::trace::TraceContextExt as _;
/// use mcp_id_guard::trace::tracing_opentelemetry::OpenTelemetrySpanExt as _;
///
/// let (parts, ()) = http::Request::post("/mcp")
///     .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
///     .body(())
///     .unwrap()
///     .into_parts();
/// // In a tool: `Extension(parts): Extension<http::request::Parts>`.
/// let span = tracing::info_span!("tool lookup");
/// let _ = span.set_parent(parent_context(&parts));
/// assert!(parent_context(&parts).span().span_context().is_valid());
/// ```
pub fn parent_context(parts: &http::request::Parts) -> Context {
    extract(&parts.headers).unwrap_or_default()
}

/// Whether `outer`, the span a request arrived in, already continues the
/// client's span: it is [`request_span`](crate::trace::request_span)'s, made
/// for this request from the same `traceparent`. Only that span: another
/// span of the same trace may be current for other reasons (a handler that
/// keeps its span entered across an `.await` leaves it current for whatever
/// the thread runs next), and parenting the guard's span on it would hang
/// one request's spans under another's.
pub(crate) fn continues(outer: &tracing::Span, client: &Context) -> bool {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let ours = outer.metadata().is_some_and(|metadata| {
        metadata.target() == REQUEST_TARGET && metadata.name() == REQUEST_SPAN
    });
    if !ours {
        return false;
    }
    let outer = outer.context();
    let outer = outer.span().span_context().clone();
    outer.is_valid() && outer.trace_id() == client.span().span_context().trace_id()
}

/// The target and name of [`request_span`](crate::trace::request_span)'s
/// span, by which [`continues`] knows it.
pub(crate) const REQUEST_TARGET: &str = "mcp_id_guard::trace";
pub(crate) const REQUEST_SPAN: &str = "request";

/// Writes `context`'s span as the request's parent (`traceparent`, and
/// `tracestate` when it has one). A context with no valid span writes
/// nothing.
pub(crate) fn inject(context: &Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(context, &mut Writer(headers));
}

/// Reads a header only when the request has exactly one of that name.
struct Strict<'a>(&'a HeaderMap);

impl Extractor for Strict<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let mut values = self.0.get_all(key).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        value.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Replaces a header; an empty or invalid value removes it.
struct Writer<'a>(&'a mut HeaderMap);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            return;
        };
        match HeaderValue::from_str(&value) {
            Ok(value) if !value.is_empty() => {
                self.0.insert(name, value);
            }
            _ => {
                self.0.remove(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(values: &[&'static str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(TRACEPARENT, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn one_valid_traceparent_is_the_parent_and_reads_back_as_written() {
        let context = extract(&headers(&[VALID])).expect("valid");
        let mut out = HeaderMap::new();
        inject(&context, &mut out);
        assert_eq!(out[TRACEPARENT], VALID);
        assert!(out.get(TRACESTATE).is_none(), "no empty tracestate");
    }

    #[test]
    fn two_headers_uppercase_zeros_and_garbage_are_invalid() {
        assert!(extract(&headers(&[VALID, VALID])).is_none());
        let zero_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let zero_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        for invalid in [
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            zero_trace,
            zero_span,
            "",
        ] {
            assert!(extract(&headers(&[invalid])).is_none(), "{invalid:?}");
        }
    }
}
