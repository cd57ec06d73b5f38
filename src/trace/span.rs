//! The `tracing` span of one POST while it is open: created when the
//! request arrives, given its messages' names and attributes when the
//! response comes, closed when the response body ends or is dropped.

use http::StatusCode;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::Context;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use std::sync::Arc;

use crate::guard::exchange::{DecisionSpan, MAX_DESCRIBED};
use crate::guard::{Exchange, GuardDecision, Handled, McpMethod};
use crate::table::SessionTag;

/// `error.type` when the response is a server error: its status code.
fn status_error(status: StatusCode) -> Option<&'static str> {
    const CODES: [&str; 12] = [
        "500", "501", "502", "503", "504", "505", "506", "507", "508", "509", "510", "511",
    ];
    let code = usize::from(status.as_u16());
    status
        .is_server_error()
        .then(|| CODES.get(code - 500).copied().unwrap_or("_OTHER"))
}

/// `error.type` of an exchange whose response never fully went out (the
/// client went away, the body failed, the service failed).
pub(crate) const INCOMPLETE: &str = "response_incomplete";

/// A span of the guard, with every field it may record declared empty (a
/// `tracing` span records only the fields its callsite names). The
/// `otel.*` fields are the ones tracing-opentelemetry maps to the span's
/// name, kind and status; the dotted names become attributes as written.
macro_rules! mcp_span {
    ($($parent:tt)*) => {
        tracing::info_span!(
            target: "mcp_id_guard::trace",
            $($parent)*
            "POST",
            otel.name = Empty,
            otel.kind = "server",
            otel.status_code = Empty,
            "error.type" = Empty,
            "http.request.method" = Empty,
            "http.response.status_code" = Empty,
            "mcp.method.name" = Empty,
            "mcp.protocol.version" = Empty,
            "mcp.session.id" = Empty,
            "jsonrpc.request.id" = Empty,
            "gen_ai.tool.name" = Empty,
            "gen_ai.operation.name" = Empty,
            "gen_ai.prompt.name" = Empty,
            "mcp_id_guard.decision" = Empty,
            "mcp_id_guard.server_request_id" = Empty,
            "mcp_id_guard.batch.undescribed" = Empty,
        )
    };
}

/// A POST's first span: its messages are not known yet.
pub(crate) fn new_span() -> Span {
    mcp_span!()
}

/// What the request told about itself, read when it arrived; shared by
/// every span of the POST.
#[derive(Debug, Default)]
pub(crate) struct Started {
    /// The client's span, when it sent a valid `traceparent`.
    pub(crate) client: Option<Context>,
    /// The span the request arrived in (the application's), parent of the
    /// guard's spans when the client sent no valid `traceparent`.
    pub(crate) outer: Option<Span>,
    /// `MCP-Protocol-Version`, when it is a short printable token.
    pub(crate) protocol: Option<Box<str>>,
    /// The session id's tag (never the id): the table's, which its log
    /// lines name too.
    pub(crate) session: Option<SessionTag>,
}

impl Started {
    /// Records what the request told of itself on a span as it opens, so
    /// every line logged inside it shows the session and the revision.
    pub(crate) fn note(&self, span: &Span) {
        if let Some(session) = &self.session {
            span.record("mcp.session.id", tracing::field::display(session));
        }
        if let Some(protocol) = &self.protocol {
            span.record("mcp.protocol.version", &**protocol);
        }
    }
}

/// The spans of a POST in flight; they close when this is dropped.
#[derive(Debug)]
pub(crate) struct OpenSpan {
    /// The first message's span: the upstream was told it is its parent.
    pub(crate) span: Span,
    started: Started,
    /// The other messages of a batch, opened when the response came.
    siblings: Vec<Span>,
    /// The first span as the guard sees it, when this layer handed it in:
    /// whether the guard described it, and the slot emptied as it closes.
    decision: Option<Arc<DecisionSpan>>,
    exchange: Option<Exchange>,
    status: Option<StatusCode>,
    /// The response body reached its end without an error.
    complete: bool,
}

impl OpenSpan {
    pub(crate) fn new(span: Span, started: Started, decision: Option<Arc<DecisionSpan>>) -> Self {
        Self {
            span,
            started,
            siblings: Vec::new(),
            decision,
            exchange: None,
            status: None,
            complete: false,
        }
    }

    /// The response arrived: its status and the guard's account of the
    /// POST. The other messages of a batch get their spans now, siblings
    /// of the first under the same parent: at most [`MAX_DESCRIBED`] in all,
    /// the first span counting the rest.
    pub(crate) fn responded(&mut self, status: StatusCode, exchange: Option<Exchange>) {
        self.status = Some(status);
        let messages = exchange.as_ref().map_or(0, Exchange::len);
        if messages > MAX_DESCRIBED {
            let undescribed = i64::try_from(messages - MAX_DESCRIBED).unwrap_or(i64::MAX);
            self.span
                .record("mcp_id_guard.batch.undescribed", undescribed);
        }
        let others = messages.clamp(1, MAX_DESCRIBED) - 1;
        for _ in 0..others {
            let sibling = match &self.started.outer {
                Some(outer) => mcp_span!(parent: outer,),
                None => mcp_span!(parent: None,),
            };
            if let Some(client) = &self.started.client {
                let _ = sibling.set_parent(client.clone());
            }
            self.started.note(&sibling);
            self.siblings.push(sibling);
        }
        self.exchange = exchange;
    }

    /// The response body ended: the answer went out.
    pub(crate) fn completed(&mut self) {
        self.complete = true;
    }

    /// Records each message's name and attributes on its span, just
    /// before they close.
    fn record(&mut self) {
        let failed = match self.status {
            None => Some(INCOMPLETE),
            Some(status) => status_error(status).or((!self.complete).then_some(INCOMPLETE)),
        };
        let common = |span: &Span| {
            if let Some(status) = self.status {
                span.record("http.response.status_code", i64::from(status.as_u16()));
            }
        };
        let handled = self.exchange.take().unwrap_or_default();
        // The first message was described when the guard decided on it: a
        // field recorded twice shows twice in a log line and may be
        // exported twice.
        let told = self.decision.as_ref().is_some_and(|d| d.described());
        if handled.is_empty() {
            common(&self.span);
            // No account came back (the client went away, a layer between
            // answered): a span the guard described keeps its name.
            if !told {
                self.span.record("http.request.method", "POST");
                name(&self.span, "POST");
            }
            error(&self.span, failed);
            return;
        }
        let spans = std::iter::once(&self.span).chain(&self.siblings);
        for (index, (span, handled)) in spans.zip(handled.iter()).enumerate() {
            common(span);
            let refused = matches!(
                handled.decision(),
                GuardDecision::Rejected | GuardDecision::Refused
            );
            if index > 0 || !told {
                describe(span, handled);
            }
            error(
                span,
                if refused {
                    Some(handled.decision().as_str())
                } else {
                    failed
                },
            );
        }
    }
}

/// Names the span: `otel.name` for tracing-opentelemetry, and the live
/// OpenTelemetry span's name too (tracing-opentelemetry reads `otel.name`
/// only until the span is started, which the `traceparent` sent upstream
/// required; without its layer the span is a no-op).
fn name(span: &Span, name: &str) {
    span.record("otel.name", name);
    span.context().span().update_name(name.to_owned());
}

/// Status `ERROR` with `error.type`, or left unset.
fn error(span: &Span, error: Option<&'static str>) {
    if let Some(error) = error {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", error);
    }
}

/// A message's span name and its own attributes (MCP semantic
/// conventions, plus the guard's decision and server-side id): when the
/// guard decides on the first message (it is handed this function), and
/// for the others as the span closes.
pub(crate) fn describe(span: &Span, handled: &Handled) {
    let method = handled.method();
    span.record("mcp.method.name", method.as_str());
    span.record("mcp_id_guard.decision", handled.decision().as_str());
    if let Some(id) = handled.request_id() {
        span.record("jsonrpc.request.id", &*id_as_text(id));
    }
    if let Some(server_id) = handled.server_id() {
        span.record("mcp_id_guard.server_request_id", &*id_as_text(server_id));
    }
    let target = match method {
        McpMethod::ToolsCall => handled.tool().inspect(|tool| {
            span.record("gen_ai.tool.name", *tool);
            span.record("gen_ai.operation.name", "execute_tool");
        }),
        McpMethod::PromptsGet => handled.prompt().inspect(|prompt| {
            span.record("gen_ai.prompt.name", *prompt);
        }),
        _ => None,
    };
    match target {
        Some(target) => name(span, &format!("{} {target}", method.as_str())),
        None => name(span, method.as_str()),
    }
}

/// `jsonrpc.request.id` is the id's string form: a string id without its
/// quotes and escapes, a number as written.
fn id_as_text(json: &str) -> Box<str> {
    if json.starts_with('"') {
        if let Ok(text) = serde_json::from_str::<String>(json) {
            return text.into();
        }
    }
    json.into()
}

impl Drop for OpenSpan {
    fn drop(&mut self) {
        self.record();
        if let Some(decision) = &self.decision {
            decision.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_ids_lose_their_quotes_numbers_stay() {
        assert_eq!(&*id_as_text("1"), "1");
        assert_eq!(&*id_as_text(r#""a\"b""#), "a\"b");
        assert_eq!(&*id_as_text(r#""\u0031""#), "1");
        // Cut short by the guard: kept as written.
        assert_eq!(&*id_as_text(r#""abc"#), r#""abc"#);
    }

    #[test]
    fn server_errors_name_their_status() {
        assert_eq!(status_error(StatusCode::BAD_GATEWAY), Some("502"));
        assert_eq!(status_error(StatusCode::OK), None);
        assert_eq!(status_error(StatusCode::TOO_MANY_REQUESTS), None);
    }
}
