use std::ops::Range;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ACCEPT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING,
};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;
use tower_service::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::envelope::{peek, splice, Kind, Peeked, Writer};
use crate::future::{media_type, ResponseFuture};
use crate::layer::{Config, IdGuardLayer};
use crate::reply;
use crate::rewrite::Edit;
use crate::stats::Stats;
use crate::table::{Admission, InFlight, Route, Table, Waiter};

/// The session header of the legacy streamable-HTTP revisions (2025-03-26 to
/// 2025-11-25). Header names are case-insensitive.
static MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
static MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// The first protocol revision without sessions (2026-07-28): each response
/// comes back on its own POST there, so ids cannot cross-wire.
const FIRST_SESSIONLESS_REVISION: &str = "2026-07-28";

/// Middleware that keeps concurrent requests with the same JSON-RPC id in one
/// MCP session from receiving each other's responses.
///
/// See the [crate docs](crate) for what is tracked and how duplicates are
/// handled. Built with [`IdGuardLayer`].
///
/// Two requests with `id: 1` in one session: while the first is in flight,
/// the second reaches the inner service with a server-side id, and its
/// response comes back with `1` restored.
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::{BodyExt, Full};
/// use mcp_id_guard::IdGuardLayer;
/// use tower::{service_fn, Service, ServiceExt};
/// use tower_layer::Layer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// // An inner server that answers each request with the id it received.
/// let server = service_fn(|request: Request<mcp_id_guard::RequestBody<Full<Bytes>>>| async move {
///     let body = request.into_body().collect().await?.to_bytes();
///     let id = serde_json::from_slice::<serde_json::Value>(&body)?["id"].clone();
///     let answer = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}});
///     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
///         Response::builder()
///             .header("content-type", "application/json")
///             .body(Full::new(Bytes::from(answer.to_string())))?,
///     )
/// });
/// let layer = IdGuardLayer::new();
/// let mut guard = layer.layer(server);
/// let call = || {
///     Request::post("/mcp")
///         .header("content-type", "application/json")
///         .header("mcp-session-id", "session-1")
///         .body(Full::new(Bytes::from_static(
///             br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
///         )))
/// };
///
/// let first = guard.ready().await?.call(call()?).await?; // in flight until its body ends
/// let second = guard.ready().await?.call(call()?).await?;
/// let answer = second.into_body().collect().await?.to_bytes();
/// assert_eq!(answer, r#"{"id":1,"jsonrpc":"2.0","result":{}}"#);
/// assert_eq!(layer.stats().remapped_total, 1);
///
/// first.into_body().collect().await?;
/// assert_eq!(layer.stats().in_flight_requests, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct IdGuard<S> {
    inner: S,
    config: Config,
    table: Arc<Table>,
}

impl<S> IdGuard<S> {
    /// Wraps `inner` with the default settings and a table of its own.
    pub fn new(inner: S) -> Self {
        tower_layer::Layer::layer(&IdGuardLayer::new(), inner)
    }

    pub(crate) fn from_parts(inner: S, config: Config, table: Arc<Table>) -> Self {
        Self {
            inner,
            config,
            table,
        }
    }

    /// A snapshot of the counters of this service's table.
    pub fn stats(&self) -> Stats {
        self.table.stats()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdGuard<S>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Clone,
    ReqBody: Body,
    ResBody: Body,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match handling(&request) {
            Handling::Untouched => {
                ResponseFuture::called(self.inner.call(request.map(RequestBody::new)), None)
            }
            // A standalone or resumed stream may carry (or replay) responses to
            // remapped requests; restoring is stateless, by the id encoding.
            Handling::RestoreStream => {
                let mut request = request;
                // Restoring needs the stream as the server wrote it.
                request.headers_mut().remove(ACCEPT_ENCODING);
                ResponseFuture::called(
                    self.inner.call(request.map(RequestBody::new)),
                    Some(Arc::clone(&self.table)),
                )
            }
            Handling::Read => {
                let limit = self.config.max_body_bytes;
                let declared_length = request
                    .headers()
                    .get(CONTENT_LENGTH)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| value.parse::<u64>().ok());
                if declared_length.is_some_and(|length| length > limit as u64) {
                    return ResponseFuture::answered(body_too_large(limit));
                }
                // The body must be read before the inner service is called, so
                // the service that `poll_ready` readied goes into the future and
                // a clone stays here for the next request.
                let clone = self.inner.clone();
                let readied = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::reading(readied, request, self.config, Arc::clone(&self.table))
            }
        }
    }
}

/// What the guard does with a request before calling the inner service.
#[derive(Debug, PartialEq, Eq)]
enum Handling {
    /// Pass it and its response through untouched, body unread.
    Untouched,
    /// A GET in a legacy session: pass it through, restore client ids in the
    /// event stream it opens.
    RestoreStream,
    /// A JSON POST in a legacy session: read the body, it may carry ids that
    /// the session's other requests could collide with.
    Read,
}

fn handling<B>(request: &Request<B>) -> Handling {
    let headers = request.headers();
    let in_legacy_session = headers.contains_key(&MCP_SESSION_ID)
        && !headers
            .get(&MCP_PROTOCOL_VERSION)
            .is_some_and(|version| is_sessionless_revision(version.as_bytes()));
    let is_json = || {
        headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| media_type(value).eq_ignore_ascii_case("application/json"))
    };
    match *request.method() {
        _ if !in_legacy_session => Handling::Untouched,
        Method::POST if is_json() => Handling::Read,
        Method::GET => Handling::RestoreStream,
        _ => Handling::Untouched,
    }
}

/// Revisions are dates (`YYYY-MM-DD`), which order as strings.
fn is_sessionless_revision(version: &[u8]) -> bool {
    let Some(date) = version.get(..10) else {
        return false;
    };
    let shaped = date.iter().enumerate().all(|(index, byte)| match index {
        4 | 7 => *byte == b'-',
        _ => byte.is_ascii_digit(),
    });
    shaped && date >= FIRST_SESSIONLESS_REVISION.as_bytes()
}

/// What to do with a tracked POST once its body is read. Returned by value and
/// consumed at once, so the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Prepared<B> {
    /// Call the inner service with `request`; `restore` says whether the
    /// response carries server-side ids to restore.
    Forward {
        request: Request<RequestBody<B>>,
        in_flight: Option<InFlight>,
        restore: bool,
    },
    /// Wait for the ticket (policy `Queue`), then forward.
    Queue {
        pending: PendingForward,
        in_flight: InFlight,
        ticket: Arc<Waiter>,
    },
    /// Answer with this response; the inner service is not called.
    Answer(Response<Full<Bytes>>),
}

/// A read POST and the byte edits to make before it goes to the inner service.
pub(crate) struct PendingForward {
    parts: http::request::Parts,
    body: Bytes,
    trailers: Option<HeaderMap>,
    edits: Vec<Edit>,
    /// A queued request's id: where it is and its text.
    queued_id: Option<(Range<usize>, Box<str>)>,
}

impl PendingForward {
    /// The response will carry server-side ids to restore: ask for it
    /// uncompressed, so it can be.
    fn restores_response(&mut self) {
        self.parts.headers.remove(ACCEPT_ENCODING);
    }

    /// The queued request's id JSON text, for the guard's own answers.
    pub(crate) fn queued_id(&self) -> &str {
        self.queued_id.as_ref().map_or("null", |(_, text)| text)
    }

    /// Builds the request for the inner service. `server_id` replaces the
    /// queued request's id when its turn came with one (`rewrite_all_ids`).
    pub(crate) fn into_request<B>(mut self, server_id: Option<&[u8]>) -> Request<RequestBody<B>> {
        if let (Some(server_id), Some((range, _))) = (server_id, self.queued_id.take()) {
            self.edits.push((range, server_id.to_vec()));
            self.restores_response();
        }
        if self.edits.is_empty() {
            return Request::from_parts(
                self.parts,
                RequestBody::buffered(self.body, self.trailers),
            );
        }
        self.edits.sort_by_key(|(range, _)| range.start);
        let rewritten = Bytes::from(splice(&self.body, &self.edits));
        self.parts.headers.remove(TRANSFER_ENCODING);
        self.parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
        Request::from_parts(self.parts, RequestBody::buffered(rewritten, self.trailers))
    }
}

/// Peeks at a tracked POST's body, asks the session table, and builds the
/// request to forward (with remapped ids spliced in) or the guard's answer.
pub(crate) fn prepare<B>(
    parts: http::request::Parts,
    body: Bytes,
    trailers: Option<HeaderMap>,
    config: &Config,
    table: &Arc<Table>,
) -> Prepared<B> {
    let mut pending = PendingForward {
        parts,
        body,
        trailers,
        edits: Vec::new(),
        queued_id: None,
    };
    let Some(session) = pending.parts.headers.get(&MCP_SESSION_ID).cloned() else {
        return untracked(pending);
    };
    // Not JSON, or JSON we cannot read as JSON-RPC: the inner server gives its
    // own error for it.
    let Some(peeked) = peek(&pending.body, Writer::Client) else {
        return untracked(pending);
    };
    let session = session.as_bytes();
    let body = pending.body.clone();
    // The peeker only hands out ranges of valid JSON tokens, so they are UTF-8.
    let token = |range: &Range<usize>| std::str::from_utf8(&body[range.clone()]).ok();
    let (id_ranges, ids): (Vec<Range<usize>>, Vec<&str>) = peeked
        .messages()
        .iter()
        .filter(|message| message.kind == Kind::Request)
        .filter_map(|message| {
            let range = message.id.clone()?;
            Some((range.clone(), token(&range)?))
        })
        .unzip();
    let cancellations: Vec<(Range<usize>, &str)> = peeked
        .messages()
        .iter()
        .filter_map(|message| {
            let range = message.cancels.clone()?;
            Some((range.clone(), token(&range)?))
        })
        .collect();
    let is_batch = matches!(peeked, Peeked::Batch(_));

    // Requests are admitted before the body's cancellations take effect, so a
    // body the guard refuses cancels nothing.
    let admission = (!ids.is_empty()).then(|| table.admit(session, &ids, is_batch, config));
    let (in_flight, restore, queued) = match admission {
        None => (None, false, None),
        Some(Admission::OverCapacity) => {
            tracing::warn!(
                session = %table.session_tag(session),
                limit = config.max_in_flight_per_session,
                "session at its in-flight limit; request refused"
            );
            let status = StatusCode::TOO_MANY_REQUESTS;
            let code = reply::SERVER_ERROR;
            let message = reply::OVER_CAPACITY_MESSAGE;
            return Prepared::Answer(if is_batch {
                reply::batch(status, code, ids.iter().map(|id| (*id, message)))
            } else {
                reply::single(status, ids[0], code, message)
            });
        }
        Some(Admission::Duplicate { colliding }) => {
            for (id, _) in ids.iter().zip(&colliding).filter(|(_, hit)| **hit) {
                log_duplicate(config, table, session, id, "rejected");
            }
            let status = config.reject_status;
            let code = reply::INVALID_REQUEST;
            return Prepared::Answer(if is_batch {
                let messages = colliding.iter().map(|hit| {
                    if *hit {
                        reply::DUPLICATE_MESSAGE
                    } else {
                        reply::BATCH_SIBLING_MESSAGE
                    }
                });
                reply::batch(status, code, ids.iter().copied().zip(messages))
            } else {
                reply::single(status, ids[0], code, reply::DUPLICATE_MESSAGE)
            });
        }
        Some(Admission::Queued { guard, ticket }) => {
            log_duplicate(config, table, session, ids[0], "queued");
            (Some(guard), false, Some(ticket))
        }
        Some(Admission::Admitted { guard, routes }) => {
            let mut remapped = false;
            for ((id, range), route) in ids.iter().zip(&id_ranges).zip(routes) {
                if let Route::Remapped {
                    server_id,
                    duplicate,
                } = route
                {
                    if duplicate {
                        log_duplicate(config, table, session, id, "remapped");
                    }
                    tracing::debug!(
                        id = %loggable(id),
                        server_id = %String::from_utf8_lossy(&server_id),
                        "forwarding with a server-side id"
                    );
                    pending.edits.push((range.clone(), server_id.to_vec()));
                    remapped = true;
                }
            }
            if remapped {
                pending.restores_response();
            }
            (Some(guard), remapped, None)
        }
    };

    for (range, request_id) in cancellations {
        let Some(target) = table.cancel(session, request_id) else {
            continue;
        };
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
            pending.edits.push((range, target.to_vec()));
        }
    }

    match (in_flight, queued) {
        (Some(in_flight), Some(ticket)) => {
            pending.queued_id = Some((id_ranges[0].clone(), ids[0].into()));
            Prepared::Queue {
                pending,
                in_flight,
                ticket,
            }
        }
        (in_flight, _) => Prepared::Forward {
            request: pending.into_request(None),
            in_flight,
            restore,
        },
    }
}

fn untracked<B>(pending: PendingForward) -> Prepared<B> {
    Prepared::Forward {
        request: pending.into_request(None),
        in_flight: None,
        restore: false,
    }
}

fn log_duplicate(config: &Config, table: &Table, session: &[u8], id: &str, outcome: &str) {
    tracing::warn!(
        policy = ?config.on_duplicate,
        id = %loggable(id),
        session = %table.session_tag(session),
        outcome,
        "request id already in flight in this session"
    );
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

/// `413` for a tracked POST over the body limit.
pub(crate) fn body_too_large(limit: usize) -> Response<Full<Bytes>> {
    reply::single(
        StatusCode::PAYLOAD_TOO_LARGE,
        "null",
        reply::INVALID_REQUEST,
        &format!("Invalid Request: request body exceeds the limit of {limit} bytes"),
    )
}

/// `503` for a request that waited too long under `OnDuplicate::Queue`.
pub(crate) fn queue_timeout(id: &str) -> Response<Full<Bytes>> {
    reply::single(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        reply::SERVER_ERROR,
        reply::QUEUE_TIMEOUT_MESSAGE,
    )
}

/// `400` for a tracked POST whose body failed while being read.
pub(crate) fn body_unreadable() -> Response<Full<Bytes>> {
    reply::single(
        StatusCode::BAD_REQUEST,
        "null",
        reply::INVALID_REQUEST,
        "Invalid Request: the request body could not be read",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().method(method);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn handling_by_method_headers_and_revision() {
        let json_in_session = [
            ("content-type", "Application/JSON; charset=utf-8"),
            ("MCP-Session-Id", "s"),
        ];
        let of = |method, headers: &[(&str, &str)]| handling(&request(method, headers));
        assert_eq!(of(Method::POST, &json_in_session), Handling::Read);
        assert_eq!(of(Method::GET, &json_in_session), Handling::RestoreStream);
        assert_eq!(of(Method::DELETE, &json_in_session), Handling::Untouched);
        assert_eq!(
            of(Method::POST, &[("content-type", "application/json")]),
            Handling::Untouched
        );
        assert_eq!(of(Method::GET, &[]), Handling::Untouched);
        assert_eq!(
            of(
                Method::POST,
                &[("content-type", "text/plain"), ("mcp-session-id", "s")]
            ),
            Handling::Untouched
        );
        let mut sessionless = json_in_session.to_vec();
        sessionless.push(("mcp-protocol-version", "2026-07-28"));
        assert_eq!(of(Method::POST, &sessionless), Handling::Untouched);
        let mut legacy = json_in_session.to_vec();
        legacy.push(("mcp-protocol-version", "2025-11-25"));
        assert_eq!(of(Method::POST, &legacy), Handling::Read);
    }

    #[test]
    fn revisions() {
        assert!(is_sessionless_revision(b"2026-07-28"));
        assert!(is_sessionless_revision(b"2027-01-01"));
        assert!(!is_sessionless_revision(b"2025-06-18"));
        assert!(!is_sessionless_revision(b"draft"));
        assert!(!is_sessionless_revision(b"9999"));
    }

    #[test]
    fn loggable_cuts_at_char_boundaries() {
        let long = "ü".repeat(100);
        assert!(loggable(&long).len() <= 64);
        assert_eq!(loggable("1"), "1");
    }
}
