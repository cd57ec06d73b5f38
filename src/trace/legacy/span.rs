//! The span of one POST while it is open: started when the request arrives, ended when its response body
//! ends or is dropped, whatever happens in between.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http::StatusCode;

use crate::guard::{Exchange, GuardDecision, Handled, McpMethod};
use crate::trace::legacy::record::{SpanRecord, Value};
use crate::trace::legacy::tracer::Tracer;

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

/// What the request told about itself, read when it arrived.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) trace_id: [u8; 16],
    /// The span id the upstream was told is its parent: the first span's.
    pub(crate) span_id: [u8; 8],
    pub(crate) parent_id: Option<[u8; 8]>,
    pub(crate) flags: u8,
    /// `MCP-Protocol-Version`, when it is a short printable token.
    pub(crate) protocol: Option<Box<str>>,
    /// The session id's tag (never the id).
    pub(crate) session: Option<String>,
    pub(crate) unix_nanos: u64,
    pub(crate) at: Instant,
}

/// The span of a POST in flight; exported once, when dropped.
#[derive(Debug)]
pub(crate) struct OpenSpan {
    tracer: Arc<Tracer>,
    started: Started,
    /// Set when the response arrived.
    exchange: Option<Exchange>,
    status: Option<StatusCode>,
    /// The response body reached its end without an error.
    complete: bool,
}

impl OpenSpan {
    pub(crate) fn new(tracer: Arc<Tracer>, started: Started) -> Self {
        Self {
            tracer,
            started,
            exchange: None,
            status: None,
            complete: false,
        }
    }

    /// The response arrived: its status and the guard's account of the POST.
    pub(crate) fn responded(&mut self, status: StatusCode, exchange: Option<Exchange>) {
        self.status = Some(status);
        self.exchange = exchange;
    }

    /// The response body ended: the answer went out.
    pub(crate) fn completed(&mut self) {
        self.complete = true;
    }

    /// The spans of the POST: one per message the guard handled, else one
    /// named after the HTTP method.
    fn records(&mut self) -> Vec<SpanRecord> {
        let started = &self.started;
        let end = started
            .unix_nanos
            .saturating_add(u64::try_from(started.at.elapsed().as_nanos()).unwrap_or(u64::MAX));
        let failed = match self.status {
            None => Some(INCOMPLETE),
            Some(status) => status_error(status).or((!self.complete).then_some(INCOMPLETE)),
        };
        let record = |span_id, name, attributes, error| SpanRecord {
            trace_id: started.trace_id,
            span_id,
            parent_id: started.parent_id,
            flags: started.flags,
            name,
            start_unix_nanos: started.unix_nanos,
            end_unix_nanos: end,
            attributes,
            error,
        };
        let mut common = Vec::with_capacity(4);
        if let Some(status) = self.status {
            common.push((
                "http.response.status_code",
                Value::Int(i64::from(status.as_u16())),
            ));
        }
        if let Some(session) = &started.session {
            common.push(("mcp.session.id", Value::Str(session.as_str().into())));
        }
        if let Some(protocol) = &started.protocol {
            common.push(("mcp.protocol.version", Value::Str(protocol.clone())));
        }
        let handled = self.exchange.take().unwrap_or_default();
        if handled.is_empty() {
            let mut attributes = common;
            attributes.push(("http.request.method", Value::Static("POST")));
            return vec![record(
                started.span_id,
                "POST".to_owned(),
                attributes,
                failed,
            )];
        }
        handled
            .iter()
            .enumerate()
            .map(|(index, handled)| {
                // The upstream was told the first span is its parent.
                let span_id = if index == 0 {
                    started.span_id
                } else {
                    self.tracer.minter.span_id()
                };
                let (name, mut attributes) = describe(handled);
                attributes.extend(common.iter().cloned());
                let refused = matches!(
                    handled.decision(),
                    GuardDecision::Rejected | GuardDecision::Refused
                );
                let error = if refused {
                    Some(handled.decision().as_str())
                } else {
                    failed
                };
                record(span_id, name, attributes, error)
            })
            .collect()
    }
}

/// A message's span name and its own attributes (MCP semantic
/// conventions, plus the guard's decision and server-side id).
fn describe(handled: &Handled) -> (String, Vec<(&'static str, Value)>) {
    let method = handled.method();
    let mut attributes = Vec::with_capacity(10);
    attributes.push(("mcp.method.name", Value::Static(method.as_str())));
    attributes.push((
        "mcp_id_guard.decision",
        Value::Static(handled.decision().as_str()),
    ));
    if let Some(id) = handled.request_id() {
        attributes.push(("jsonrpc.request.id", Value::Str(id_as_text(id))));
    }
    if let Some(server_id) = handled.server_id() {
        attributes.push((
            "mcp_id_guard.server_request_id",
            Value::Str(id_as_text(server_id)),
        ));
    }
    let target = match method {
        McpMethod::ToolsCall => handled.tool().inspect(|tool| {
            attributes.push(("gen_ai.tool.name", Value::Str((*tool).into())));
            attributes.push(("gen_ai.operation.name", Value::Static("execute_tool")));
        }),
        McpMethod::PromptsGet => handled.prompt().inspect(|prompt| {
            attributes.push(("gen_ai.prompt.name", Value::Str((*prompt).into())));
        }),
        _ => None,
    };
    let name = match target {
        Some(target) => format!("{} {target}", method.as_str()),
        None => method.as_str().to_owned(),
    };
    (name, attributes)
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
        for record in self.records() {
            self.tracer.send(record);
        }
    }
}

/// Now, in nanoseconds since the Unix epoch.
pub(crate) fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        })
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
