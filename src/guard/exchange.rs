//! What the guard did with each JSON-RPC message of a POST, left on the
//! response for the layers outside it (the metrics layer counts requests by
//! method and decision from it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::table::InlineVec;
use crate::wire::method::McpMethod;

/// What the guard did with one message of a POST. Each value is counted in
/// the guard's [`Stats`](crate::Stats) too, except `refused` (there split by
/// cause) and `passed` for a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum GuardDecision {
    /// Forwarded as the client wrote it: a request with its own id, a
    /// notification (other than a cancellation that freed an id), or a POST
    /// the guard does not track (no session, revision 2026-07-28, a body that
    /// is no JSON-RPC).
    Passed,
    /// A request forwarded with a server-side id (a duplicate of an id in
    /// flight, an abandoned id reused, or `rewrite_all_ids`).
    Remapped,
    /// A duplicate the policy refused (`Reject`, or a batch under `Queue`):
    /// answered by the guard, never forwarded.
    Rejected,
    /// A request that waited for its id under `Queue`, whatever came of it
    /// (forwarded when its turn came, or `503` after `max_queue_wait`).
    Queued,
    /// Answered by the guard for any other reason: the session at its
    /// in-flight cap, the table at its byte budget, a session id too long, a
    /// body too large, unreadable or compressed, several session headers, or
    /// a request of a batch refused for its sibling's duplicate.
    Refused,
    /// A `notifications/cancelled` that named a request in flight in its
    /// session (and freed its id); forwarded.
    Cancelled,
}

impl GuardDecision {
    /// Every decision, in order.
    pub const ALL: &'static [GuardDecision] = &[
        Self::Passed,
        Self::Remapped,
        Self::Rejected,
        Self::Queued,
        Self::Refused,
        Self::Cancelled,
    ];

    /// The decision as a label value: `passed`, `remapped`, `rejected`,
    /// `queued`, `refused` or `cancelled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Remapped => "remapped",
            Self::Rejected => "rejected",
            Self::Queued => "queued",
            Self::Refused => "refused",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One message of a POST: its method, what the guard did with it, and,
/// when a layer outside asked for them, the name a `tools/call` or
/// `prompts/get` names and a request's ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    method: McpMethod,
    decision: GuardDecision,
    /// `params.name` of a `tools/call` or a `prompts/get`.
    name: Option<Box<str>>,
    /// Only when asked ([`WantsRequestIds`]): boxed, so the common
    /// message costs one pointer for them.
    ids: Option<Box<RequestIds>>,
}

/// A request's id as the client wrote it and, when remapped, as the server
/// saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RequestIds {
    client: Box<str>,
    server: Option<Box<str>>,
}

impl Handled {
    /// The message's method (`Other` for any method not in the closed list).
    pub fn method(&self) -> McpMethod {
        self.method
    }

    /// What the guard did with it.
    pub fn decision(&self) -> GuardDecision {
        self.decision
    }

    /// A `tools/call`'s `params.name`, read only when a layer outside the
    /// guard asked for tool names (the metrics layer's
    /// [`tool_names`](crate::protect::metrics::MetricsLayer::tool_names)),
    /// and only a name as MCP allows them (1 to 128 ASCII letters, digits,
    /// `_`, `-` and `.`): anything else, and any other message, has none.
    pub fn tool(&self) -> Option<&str> {
        self.name
            .as_deref()
            .filter(|_| self.method == McpMethod::ToolsCall)
    }

    /// A `prompts/get`'s `params.name`, read only when a layer outside the
    /// guard asked for request ids (the trace layer, feature `otel`), and
    /// only a name as [`tool`](Self::tool) allows.
    pub fn prompt(&self) -> Option<&str> {
        self.name
            .as_deref()
            .filter(|_| self.method == McpMethod::PromptsGet)
    }

    /// A request's `id` as its JSON text (`1`, `"a"`), cut to at most 256
    /// bytes; only when a layer outside the guard asked for
    /// request ids (the trace layer, feature `otel`). Notifications have
    /// none.
    pub fn request_id(&self) -> Option<&str> {
        self.ids.as_ref().map(|ids| &*ids.client)
    }

    /// The server-side id a [`Remapped`](GuardDecision::Remapped) request
    /// went to the server with (JSON text, cut as
    /// [`request_id`](Self::request_id): it holds the client's id), when
    /// request ids were asked for.
    /// A request queued under `rewrite_all_ids` gets its server-side id when
    /// its turn comes, after this account was written: it has none here.
    pub fn server_id(&self) -> Option<&str> {
        self.ids.as_ref().and_then(|ids| ids.server.as_deref())
    }
}

/// The most messages of one POST described one by one, in the guard's
/// decision events and in the trace layer's spans: a batch is the client's
/// to size, up to the body limit, and the lines and spans go to the
/// operator's disk and trace store.
pub(crate) const MAX_DESCRIBED: usize = 16;

/// The most bytes of a request id's text an [`Exchange`] keeps
/// ([`Handled::request_id`]): ids are the client's to choose, up to the body
/// limit.
pub(crate) const MAX_ID_TEXT: usize = 256;

/// An id's text cut to at most [`MAX_ID_TEXT`] bytes, at a character
/// boundary.
pub(crate) fn id_text(id: &str) -> Box<str> {
    let mut end = id.len().min(MAX_ID_TEXT);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    id[..end].into()
}

/// The request extension by which a layer outside the guard asks it to read
/// the tool name of each `tools/call` (the guard reads it from the same
/// envelope, at the cost of a second pass over the call's `params`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WantsToolNames;

/// The request extension by which a layer outside the guard asks it for
/// each request's id, the server-side id of a remapped one, and the name a
/// `tools/call` or `prompts/get` names (the trace layer): a copy of at most
/// [`MAX_ID_TEXT`] bytes per id, and a second pass over the call's `params`.
///
/// It also carries the layer's span, which the guard describes by the POST's
/// first message as soon as it has decided on the read body, not only on the
/// response: what the server logs inside the span while it handles the
/// request then shows the method, the id and the decision.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct WantsRequestIds(pub(crate) Arc<DecisionSpan>);

/// The trace layer's span, shared with the guard until the span closes.
///
/// The span is held in a slot the trace layer empties as the span closes:
/// a server that keeps a request's extensions (rmcp hands them to its tools,
/// an app may keep an `initialize`'s) keeps only the empty slot, never the
/// span open. `describe` is the trace layer's function, so the span's field
/// names stay in one place and the guard imports nothing of the trace layer.
#[derive(Debug)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct DecisionSpan {
    span: Mutex<Option<tracing::Span>>,
    describe: fn(&tracing::Span, &Handled),
    /// The first message was described: a field recorded twice shows
    /// twice in a log line and may be exported twice.
    described: AtomicBool,
}

#[cfg_attr(not(feature = "otel"), allow(dead_code))]
impl DecisionSpan {
    pub(crate) fn new(span: tracing::Span, describe: fn(&tracing::Span, &Handled)) -> Arc<Self> {
        Arc::new(Self {
            span: Mutex::new(Some(span)),
            describe,
            described: AtomicBool::new(false),
        })
    }

    /// Describes the span by `first`, once, while it is open.
    fn tell(&self, first: &Handled) {
        let span = self.span.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(span) = &*span {
            if !self.described.swap(true, Ordering::Relaxed) {
                (self.describe)(span, first);
            }
        }
    }

    /// Whether the guard described the span.
    pub(crate) fn described(&self) -> bool {
        self.described.load(Ordering::Relaxed)
    }

    /// The span closes: the slot lets go of it.
    pub(crate) fn close(&self) {
        let span = self
            .span
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(span);
    }
}

/// Put in a request's extensions by a layer outside the guard that reads the
/// [`Exchange`] of its response (as
/// [`MetricsLayer`](crate::protect::metrics::MetricsLayer) does): without
/// it, the guard leaves none.
///
/// ```
/// use mcp_id_guard::exchange::WantsExchange;
///
/// let mut request = http::Request::post("/mcp").body(()).unwrap();
/// request.extensions_mut().insert(WantsExchange);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct WantsExchange;

/// A tool name as a label value: MCP's tool names (revision 2025-11-25: 1 to
/// 128 of `A-Z a-z 0-9 _ - .`), which need no escaping anywhere; `None` for
/// anything else.
pub(crate) fn tool_label(name: &[u8]) -> Option<Box<str>> {
    let allowed = |byte: &u8| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.');
    if name.is_empty() || name.len() > 128 || !name.iter().all(allowed) {
        return None;
    }
    std::str::from_utf8(name).ok().map(Box::from)
}

/// The guard's account of one POST, put in the extensions of its response
/// (the inner service's or the guard's own) when the request's extensions
/// hold a [`WantsExchange`] (the metrics layer inserts one), so a guard with
/// no layer outside that reads it costs no extension per request: the method of each request and
/// notification in it, in order (a batch has one per member; client
/// responses to server requests and elements that are no message have none),
/// and what the guard did with each.
///
/// A POST the guard does not read (no session, revision 2026-07-28) counts as
/// one message, `passed`, whose method is the `Mcp-Method` header's (which
/// revision 2026-07-28 sends) or `Other`; one without `Mcp-Session-Id` whose
/// successful answer carries one is `Initialize` (only an `initialize`
/// answer starts a session: a stateless server's `initialize`, which starts
/// none, stays `Other`, as the guard does not read its body). A POST refused before its body
/// could be read counts as one `Other`, `refused`. `GET` and `DELETE` carry
/// no `Exchange`.
///
/// ```
/// # use http::Response;
/// use mcp_id_guard::exchange::{Exchange, GuardDecision, McpMethod};
///
/// fn remapped_tool_calls<B>(response: &Response<B>) -> usize {
///     response.extensions().get::<Exchange>().map_or(0, |exchange| {
///         exchange
///             .iter()
///             .filter(|handled| {
///                 handled.method() == McpMethod::ToolsCall
///                     && handled.decision() == GuardDecision::Remapped
///             })
///             .count()
///     })
/// }
/// # assert_eq!(remapped_tool_calls(&Response::new(())), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    // Nearly every POST carries one message: kept inline, no allocation.
    handled: InlineVec<Handled>,
    /// One message of unknown method in a POST without `Mcp-Session-Id`:
    /// an answer that starts a session makes it an `initialize`.
    may_open_session: bool,
}

impl Exchange {
    /// One message, no tool name.
    pub(crate) fn one(method: McpMethod, decision: GuardDecision) -> Self {
        Self {
            handled: smallvec::smallvec![Handled {
                method,
                decision,
                name: None,
                ids: None,
            }],
            may_open_session: false,
        }
    }

    /// One message, `passed`, of a POST without `Mcp-Session-Id` that the
    /// guard forwards unread: `method` (the `Mcp-Method` header's), or,
    /// when that names none, [`McpMethod::Initialize`] once the answer
    /// starts a session ([`opened_session`](Self::opened_session)).
    pub(crate) fn sessionless(method: McpMethod) -> Self {
        let mut exchange = Self::one(method, GuardDecision::Passed);
        exchange.may_open_session = method == McpMethod::Other;
        exchange
    }

    /// The answer to the POST started a session (a success carrying
    /// `Mcp-Session-Id`): a message of a [`sessionless`](Self::sessionless)
    /// POST whose method was unknown is the `initialize` that opened it.
    pub(crate) fn opened_session(&mut self) {
        if std::mem::take(&mut self.may_open_session) {
            if let [only] = &mut self.handled[..] {
                only.method = McpMethod::Initialize;
            }
        }
    }

    /// Describes the trace layer's span by the first message: not while its
    /// method waits for the answer (a [`sessionless`](Self::sessionless)
    /// POST), so the span is described once, as it closes.
    pub(crate) fn tell(&self, wants: &WantsRequestIds) {
        if let Some(first) = self.handled.first().filter(|_| !self.may_open_session) {
            wants.0.tell(first);
        }
    }

    /// One more message; `ids`: the request's id text (cut with
    /// [`id_text`]) and its server-side id, when asked for.
    pub(crate) fn push(
        &mut self,
        method: McpMethod,
        decision: GuardDecision,
        name: Option<Box<str>>,
        ids: Option<(Box<str>, Option<Box<str>>)>,
    ) {
        self.handled.push(Handled {
            method,
            decision,
            name,
            ids: ids.map(|(client, server)| Box::new(RequestIds { client, server })),
        });
    }

    /// The messages, in the POST's order.
    pub fn iter(&self) -> std::slice::Iter<'_, Handled> {
        self.handled.iter()
    }

    /// How many messages the POST held.
    pub fn len(&self) -> usize {
        self.handled.len()
    }

    /// Whether it held none (only client responses, say).
    pub fn is_empty(&self) -> bool {
        self.handled.is_empty()
    }
}

impl<'a> IntoIterator for &'a Exchange {
    type Item = &'a Handled;
    type IntoIter = std::slice::Iter<'a, Handled>;

    fn into_iter(self) -> Self::IntoIter {
        self.handled.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::tool_label;

    #[test]
    fn tool_labels_are_mcp_tool_names() {
        assert_eq!(
            tool_label(b"get_weather-v2.1").as_deref(),
            Some("get_weather-v2.1")
        );
        let longest = "a".repeat(128);
        assert_eq!(tool_label(longest.as_bytes()).as_deref(), Some(&*longest));
        for refused in [
            &b""[..],
            "a".repeat(129).as_bytes(),
            b"two words",
            b"quote\"",
            b"new\nline",
            b"back\\slash",
            "caf\u{e9}".as_bytes(),
            b"\xff",
        ] {
            assert_eq!(tool_label(refused), None, "{refused:?}");
        }
    }
}
