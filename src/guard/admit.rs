//! The request-side decision: once a tracked POST's body is read, peek at
//! its envelope, ask the session table, and build either the request to
//! forward (server-side ids spliced in) or the guard's own answer.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT_ENCODING, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use smallvec::SmallVec;

use crate::guard::body::RequestBody;
use crate::guard::exchange::{
    id_text, tool_label, Exchange, GuardDecision, WantsRequestIds, WantsToolNames, MAX_DESCRIBED,
};
use crate::table::config::Config;
use crate::table::{unzip, Decision, InlineVec, Log, Registration, Route, Table, Waiter};
use crate::wire::answer;
use crate::wire::edit::{splice, Edit};
use crate::wire::envelope::{read, tool_name, utf8_bom, Kind, Peeked, Reading, Unreadable};
use crate::wire::method::McpMethod;
use crate::wire::protocol::RequestHeaders;

/// What to do with a tracked POST once its body is read. Returned by value and
/// consumed at once, so the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Admission<B> {
    /// Call the inner service with `request`; `restore` says whether the
    /// response carries server-side ids to restore.
    Forward {
        request: Request<RequestBody<B>>,
        registration: Option<Registration>,
        restore: bool,
    },
    /// Wait for the ticket (policy `Queue`), then forward.
    Queue {
        pending: PendingForward,
        registration: Registration,
        ticket: Arc<Waiter>,
    },
    /// Answer with this response; the inner service is not called.
    Answer(Response<Full<Bytes>>),
}

/// A read POST and the byte edits to make before it goes to the inner service.
pub(crate) struct PendingForward {
    parts: http::request::Parts,
    body: Bytes,
    trailers: Option<Box<HeaderMap>>,
    /// Inline: a remapped lone request, the usual edit, allocates none.
    edits: SmallVec<[Edit; 1]>,
    /// The body is shorter than the client sent (a byte order mark dropped).
    resized: bool,
    /// A queued request's id: where it is and its text.
    queued_id: Option<(Range<usize>, Box<str>)>,
}

impl PendingForward {
    /// A read request, as it would go on untouched.
    pub(crate) fn new(
        parts: http::request::Parts,
        body: Bytes,
        trailers: Option<Box<HeaderMap>>,
    ) -> Self {
        Self {
            parts,
            body,
            trailers,
            edits: SmallVec::new(),
            resized: false,
            queued_id: None,
        }
    }

    /// The response will be read (for the responses that free the ids, and
    /// to restore server-side ids): ask for it uncompressed, so it can be.
    fn reads_response(&mut self) {
        self.parts.headers.remove(ACCEPT_ENCODING);
    }

    /// The queued request's id JSON text, for the guard's own answers.
    pub(crate) fn queued_id(&self) -> &str {
        self.queued_id.as_ref().map_or("null", |(_, text)| text)
    }

    /// Builds the request for the inner service. `server_id` replaces the
    /// queued request's id when its turn came with one (`rewrite_all_ids`).
    pub(crate) fn into_request<B>(
        mut self,
        server_id: Option<Arc<[u8]>>,
    ) -> Request<RequestBody<B>> {
        if let (Some(server_id), Some((range, _))) = (server_id, self.queued_id.take()) {
            self.edits.push((range, server_id));
            self.reads_response();
        }
        if self.edits.is_empty() && !self.resized {
            return Request::from_parts(
                self.parts,
                RequestBody::buffered(self.body, self.trailers),
            );
        }
        self.edits.sort_by_key(|(range, _)| range.start);
        let rewritten = if self.edits.is_empty() {
            self.body
        } else {
            Bytes::from(splice(&self.body, &self.edits))
        };
        self.parts.headers.remove(TRANSFER_ENCODING);
        self.parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
        Request::from_parts(self.parts, RequestBody::buffered(rewritten, self.trailers))
    }
}

/// The target of the guard's decision events: one `DEBUG` line per message
/// of a read POST (`RUST_LOG=mcp_id_guard::decision=debug`).
const DECISIONS: &str = "mcp_id_guard::decision";

/// Peeks at a tracked POST's body, asks the session table, and builds the
/// request to forward (with remapped ids spliced in) or the guard's answer;
/// what became of each message goes into `exchange` (message by message
/// only when `record`: a layer outside reads it).
///
/// The decision is told where it is taken, inside the trace layer's span
/// when there is one: the span learns its first message
/// ([`WantsRequestIds`]), and, when enabled, one `DEBUG` event per message
/// says what the guard did.
pub(crate) fn admit<B>(
    mut pending: PendingForward,
    headers: &RequestHeaders,
    config: &Config,
    table: &Arc<Table>,
    exchange: &mut Exchange,
    record: bool,
) -> Admission<B> {
    // Taken out: the handle on the span is for the guard, and a server that
    // kept the request's extensions would keep the span open.
    let told = pending.parts.extensions.remove::<WantsRequestIds>();
    let logged = tracing::enabled!(target: DECISIONS, tracing::Level::DEBUG);
    let ids = logged || told.is_some();
    let admission = judge(
        pending,
        headers,
        config,
        table,
        exchange,
        record || logged,
        ids,
    );
    // The span first, so that the event shows it described.
    if let Some(told) = &told {
        exchange.tell(told);
    }
    if logged {
        log_decisions(exchange, headers, table);
    }
    admission
}

/// One `DEBUG` event per message of the read POST, the first
/// [`MAX_DESCRIBED`] of a batch and a count of the rest.
fn log_decisions(exchange: &Exchange, headers: &RequestHeaders, table: &Table) {
    // `display` is in scope inside tracing's macros.
    let session = headers
        .session
        .as_ref()
        .map(|session| table.session_tag(session.as_bytes()));
    let more = exchange.len().saturating_sub(MAX_DESCRIBED);
    if more > 0 {
        tracing::debug!(
            target: DECISIONS,
            session = session.map(display),
            "a batch of {} messages: the decisions on the first {MAX_DESCRIBED} follow",
            exchange.len()
        );
    }
    for handled in exchange.iter().take(MAX_DESCRIBED) {
        tracing::debug!(
            target: DECISIONS,
            method = handled.method().as_str(),
            id = handled.request_id().map(|id| display(loggable(id))),
            decision = handled.decision().as_str(),
            server_id = handled.server_id().map(|id| display(loggable(id))),
            session = session.map(display),
            "guard decided"
        );
    }
}

/// [`admit`], without telling; `wants_ids`: the account of each message holds its
/// ids (for the trace layer, or for the decision events).
fn judge<B>(
    mut pending: PendingForward,
    headers: &RequestHeaders,
    config: &Config,
    table: &Arc<Table>,
    exchange: &mut Exchange,
    record: bool,
    wants_ids: bool,
) -> Admission<B> {
    let Some(session) = &headers.session else {
        *exchange = Exchange::sessionless(headers.method);
        return untracked(pending);
    };
    // Until the body is read, the guard's answer refuses one message of
    // unknown method.
    *exchange = Exchange::one(McpMethod::Other, GuardDecision::Refused);
    let session_id_too_long = session.len() > config.max_session_id_bytes;
    let peeked = match screen(&mut pending, headers) {
        Ok(Reading::Read(peeked)) => peeked,
        Ok(Reading::NotJsonRpc) if session_id_too_long => {
            return Admission::Answer(session_id_refusal(
                table,
                session.as_bytes(),
                &[],
                false,
                config,
            ));
        }
        // No server reads it as JSON-RPC; the server gives its own error.
        Ok(Reading::NotJsonRpc) => {
            *exchange = Exchange::one(headers.method, GuardDecision::Passed);
            return untracked(pending);
        }
        Ok(Reading::Unreadable(why)) => return Admission::Answer(answer::unreadable(why)),
        Err(refusal) => return Admission::Answer(refusal),
    };
    let session = session.as_bytes();
    let body = pending.body.clone();
    let (id_ranges, ids) = unzip(peeked.request_ids(&body).collect());
    // What layers outside asked for: the tool names of `tools/call`s (the
    // metrics layer), each request's ids (the trace layer, the decision
    // events).
    let extensions = &pending.parts.extensions;
    let wants = Wants {
        tools: extensions.get::<WantsToolNames>().is_some(),
        ids: wants_ids.then_some(&ids[..]),
    };
    let is_batch = matches!(peeked, Peeked::Batch(_));
    if session_id_too_long && ids.is_empty() {
        // Requests are refused below, by the table; a body without any is
        // refused here, so nothing in such a session reaches the server.
        *exchange = all_refused(&peeked, &body, &wants);
        return Admission::Answer(session_id_refusal(table, session, &ids, is_batch, config));
    }

    // Requests are admitted before the body's cancellations take effect, so a
    // body the guard refuses cancels nothing.
    let admission = (!ids.is_empty()).then(|| table.admit(session, &ids, is_batch, config));
    let asked = Asked {
        table,
        config,
        session,
        ids: &ids,
        is_batch,
    };
    // What became of each request, in order, and the server-side id of
    // each remapped one when asked for.
    let decisions: InlineVec<GuardDecision>;
    let mut server_ids: InlineVec<Option<Box<str>>> = InlineVec::default();
    let (registration, restore, queued) = match admission {
        None => {
            decisions = InlineVec::default();
            (None, false, None)
        }
        Some(Decision::Queued {
            registration,
            ticket,
        }) => {
            log_duplicate(config, table, session, ids[0], "queued");
            pending.reads_response();
            decisions = smallvec::smallvec![GuardDecision::Queued];
            (Some(registration), false, Some(ticket))
        }
        Some(Decision::Admitted {
            registration,
            routes,
        }) => {
            decisions = InlineVec::from_iter(routes.iter().map(|route| match route {
                Route::AsIs => GuardDecision::Passed,
                Route::Remapped { .. } => GuardDecision::Remapped,
            }));
            if wants.ids.is_some() {
                server_ids = InlineVec::from_iter(routes.iter().map(|route| match route {
                    Route::AsIs => None,
                    Route::Remapped { server_id, .. } => {
                        Some(id_text(&String::from_utf8_lossy(server_id)))
                    }
                }));
            }
            let remapped = asked.remap(&mut pending, &id_ranges, routes);
            pending.reads_response();
            (Some(registration), remapped, None)
        }
        Some(refused) => {
            *exchange = refused_exchange(&refused, &peeked, &body, &wants);
            return Admission::Answer(asked.refusal(refused));
        }
    };
    let cancelled = cancel(&mut pending, &peeked, &body, table, session);
    if record {
        *exchange = handled(
            &peeked,
            &body,
            &wants,
            |request| {
                let decision = decisions
                    .get(request)
                    .copied()
                    .unwrap_or(GuardDecision::Passed);
                (decision, server_ids.get(request).cloned().flatten())
            },
            |message| {
                if cancelled.contains(&message) {
                    GuardDecision::Cancelled
                } else {
                    GuardDecision::Passed
                }
            },
        );
    }

    match (registration, queued) {
        (Some(registration), Some(ticket)) => {
            pending.queued_id = Some((id_ranges[0].clone(), ids[0].into()));
            Admission::Queue {
                pending,
                registration,
                ticket,
            }
        }
        (registration, _) => Admission::Forward {
            request: pending.into_request(None),
            registration,
            restore,
        },
    }
}

/// Reads a tracked POST's body after the checks its headers call for: a
/// body no server can be trusted to read alike is refused before it is read.
/// The refusal is returned by value and answered at once, like [`Admission`].
#[allow(clippy::result_large_err)]
fn screen(
    pending: &mut PendingForward,
    headers: &RequestHeaders,
) -> Result<Reading, Response<Full<Bytes>>> {
    // Servers disagree on which of several headers counts (the first, the
    // last, or all joined): no reading is safe.
    if headers.several_sessions {
        return Err(answer::several_sessions());
    }
    // A server that inflates request bodies reads a request the guard
    // cannot see in the compressed bytes.
    if headers.encoded {
        return Err(answer::unreadable(Unreadable::Compressed));
    }
    // The Python SDK skips a UTF-8 byte order mark, serde refuses one: drop
    // it, so every server reads the bytes the guard read.
    let bom = utf8_bom(&pending.body);
    if bom > 0 {
        pending.body = pending.body.slice(bom..);
        pending.resized = true;
    }
    Ok(read(&pending.body))
}

/// What became of each message of a POST the table refused: its
/// notifications are refused with it.
fn refused_exchange(refused: &Decision, peeked: &Peeked, body: &[u8], wants: &Wants) -> Exchange {
    match refused {
        Decision::Duplicate { colliding } => handled(
            peeked,
            body,
            wants,
            |request| match colliding.get(request) {
                Some(true) => (GuardDecision::Rejected, None),
                _ => (GuardDecision::Refused, None),
            },
            |_| GuardDecision::Refused,
        ),
        _ => all_refused(peeked, body, wants),
    }
}

/// What layers outside the guard asked it to note for each message.
struct Wants<'a> {
    /// The tool name of each `tools/call`.
    tools: bool,
    /// Each request's id (the POST's request ids, in order), server-side
    /// id and the name a `tools/call` or `prompts/get` names.
    ids: Option<&'a [&'a str]>,
}

/// A POST's requests as the table was asked about them.
struct Asked<'a> {
    table: &'a Arc<Table>,
    config: &'a Config,
    session: &'a [u8],
    ids: &'a [&'a str],
    is_batch: bool,
}

impl Asked<'_> {
    /// The guard's own answer to requests the table refused.
    fn refusal(&self, decision: Decision) -> Response<Full<Bytes>> {
        let Self {
            table,
            config,
            session,
            ids,
            is_batch,
        } = *self;
        match decision {
            Decision::OverCapacity => {
                if let Some(suppressed) = Log::OverCapacity.due(table) {
                    tracing::warn!(
                        session = %table.session_tag(session),
                        limit = config.max_in_flight_per_session,
                        "session at its in-flight limit; request refused \
                         ({suppressed} more since the last such line)"
                    );
                }
                let status = StatusCode::TOO_MANY_REQUESTS;
                let code = answer::SERVER_ERROR;
                let message = answer::OVER_CAPACITY_MESSAGE;
                if is_batch {
                    answer::batch(status, code, ids.iter().map(|id| (*id, message)))
                } else {
                    answer::single(status, ids[0], code, message)
                }
            }
            Decision::OverBudget => {
                if let Some(suppressed) = Log::OverBudget.due(table) {
                    tracing::warn!(
                        session = %table.session_tag(session),
                        limit = config.max_table_bytes,
                        "table at its byte budget; request refused \
                         ({suppressed} more since the last such line)"
                    );
                }
                answer::over_budget(ids, is_batch)
            }
            Decision::Duplicate { colliding } => {
                for (id, _) in ids.iter().zip(&colliding).filter(|(_, hit)| **hit) {
                    log_duplicate(config, table, session, id, "rejected");
                }
                let status = config.reject_status;
                let code = answer::INVALID_REQUEST;
                if is_batch {
                    let messages = colliding.iter().map(|hit| {
                        if *hit {
                            answer::DUPLICATE_MESSAGE
                        } else {
                            answer::BATCH_SIBLING_MESSAGE
                        }
                    });
                    answer::batch(status, code, ids.iter().copied().zip(messages))
                } else {
                    answer::single(status, ids[0], code, answer::DUPLICATE_MESSAGE)
                }
            }
            // `SessionIdTooLong`; the admitted and queued decisions are no
            // refusal and never come here.
            _ => session_id_refusal(table, session, ids, is_batch, config),
        }
    }

    /// Edits the ids of the requests that go with a server-side id; says
    /// whether any does.
    fn remap(
        &self,
        pending: &mut PendingForward,
        id_ranges: &[Range<usize>],
        routes: InlineVec<Route>,
    ) -> bool {
        let mut remapped = false;
        for ((id, range), route) in self.ids.iter().zip(id_ranges).zip(routes) {
            if let Route::Remapped {
                server_id,
                duplicate,
            } = route
            {
                if duplicate {
                    log_duplicate(self.config, self.table, self.session, id, "remapped");
                }
                tracing::debug!(
                    id = %loggable(id),
                    server_id = %loggable(&String::from_utf8_lossy(&server_id)),
                    "forwarding with a server-side id"
                );
                pending.edits.push((range.clone(), server_id));
                remapped = true;
            }
        }
        remapped
    }
}

/// Applies the body's cancellations: each frees the in-flight id it names,
/// and is edited to name the request as the server knows it. The indices of
/// the messages that freed one.
fn cancel(
    pending: &mut PendingForward,
    peeked: &Peeked,
    body: &[u8],
    table: &Table,
    session: &[u8],
) -> InlineVec<usize> {
    let mut cancelled = InlineVec::default();
    for (message, range, request_id) in peeked.cancelled_ids(body) {
        let Some(target) = table.cancel(session, request_id) else {
            continue;
        };
        cancelled.push(message);
        tracing::debug!(
            request_id = %loggable(request_id),
            session = %table.session_tag(session),
            "cancellation frees an in-flight id"
        );
        // Name the request as the server knows it: its server-side id, or
        // the client's own id text when the cancellation spelled an
        // equivalent id differently (`"1"` for `1`: typed servers compare
        // exactly).
        if *target != *request_id.as_bytes() {
            pending.edits.push((range, target));
        }
    }
    cancelled
}

/// What became of each message of a read body that has a method, in order:
/// `request(i)` for its `i`-th request (with its server-side id, if any),
/// `notification(index)` for the notification at `index` among the
/// messages; with what `wants` asks for.
fn handled(
    peeked: &Peeked,
    body: &[u8],
    wants: &Wants,
    request: impl Fn(usize) -> (GuardDecision, Option<Box<str>>),
    notification: impl Fn(usize) -> GuardDecision,
) -> Exchange {
    let mut exchange = Exchange::default();
    let mut requests = 0;
    for (index, message) in peeked.messages().iter().enumerate() {
        let Some(method) = message.method.clone() else {
            continue;
        };
        let (decision, ids) = match message.kind {
            Kind::Request => {
                requests += 1;
                let (decision, server_id) = request(requests - 1);
                let client_id = wants.ids.and_then(|ids| ids.get(requests - 1));
                (decision, client_id.map(|id| (id_text(id), server_id)))
            }
            _ => (notification(index), None),
        };
        let method = McpMethod::from_token(&body[method]);
        let named = match method {
            McpMethod::ToolsCall => wants.tools || wants.ids.is_some(),
            McpMethod::PromptsGet => wants.ids.is_some(),
            _ => false,
        };
        let name = match &message.params {
            Some(params) if named => {
                tool_name(body, params.clone()).and_then(|name| tool_label(&name))
            }
            _ => None,
        };
        exchange.push(method, decision, name, ids);
    }
    exchange
}

/// The guard's answer to a POST in a session whose id is over
/// `max_session_id_bytes` (the table counted the requests it refused itself).
fn session_id_refusal(
    table: &Table,
    session: &[u8],
    ids: &[&str],
    is_batch: bool,
    config: &Config,
) -> Response<Full<Bytes>> {
    if let Some(suppressed) = Log::SessionIdTooLong.due(table) {
        tracing::warn!(
            session = %table.session_tag(session),
            length = session.len(),
            limit = config.max_session_id_bytes,
            "session id too long; request refused ({suppressed} more since the last such line)"
        );
    }
    answer::session_id_too_long(ids, is_batch, config.max_session_id_bytes)
}

/// A read body the guard answers itself: every message refused.
fn all_refused(peeked: &Peeked, body: &[u8], wants: &Wants) -> Exchange {
    handled(
        peeked,
        body,
        wants,
        |_| (GuardDecision::Refused, None),
        |_| GuardDecision::Refused,
    )
}

fn untracked<B>(pending: PendingForward) -> Admission<B> {
    Admission::Forward {
        request: pending.into_request(None),
        registration: None,
        restore: false,
    }
}

/// Duplicates are the normal case with clients that send every call as
/// `id: 1` (the metrics count each): one `INFO` line per interval, with a
/// count of the rest, never a warning per request.
fn log_duplicate(config: &Config, table: &Table, session: &[u8], id: &str, outcome: &str) {
    if let Some(suppressed) = Log::Duplicate.due(table) {
        tracing::info!(
            policy = ?config.on_duplicate,
            id = %loggable(id),
            session = %table.session_tag(session),
            outcome,
            "request id already in flight in this session \
             ({suppressed} more such requests since the last such line)"
        );
    }
}

/// An id's JSON text for a log line, cut short: ids may be megabytes.
fn loggable(id: &str) -> &str {
    const MAX: usize = 64;
    if id.len() <= MAX {
        return id;
    }
    let mut end = MAX;
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    &id[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loggable_cuts_at_char_boundaries() {
        let long = "ü".repeat(100);
        assert!(loggable(&long).len() <= 64);
        assert_eq!(loggable("1"), "1");
    }
}
