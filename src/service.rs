use std::ops::Range;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;
use tower_service::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::envelope::{peek, splice, Kind, Peeked};
use crate::future::{media_type, ResponseFuture};
use crate::layer::{Config, IdGuardLayer};
use crate::reply;
use crate::stats::Stats;
use crate::table::{Admission, InFlight, Route, Table};

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
        if !is_tracked_candidate(&request) {
            return ResponseFuture::called(self.inner.call(request.map(RequestBody::new)));
        }
        let limit = self.config.max_body_bytes;
        let declared_length = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if declared_length.is_some_and(|length| length > limit as u64) {
            return ResponseFuture::answered(body_too_large(limit));
        }
        // The body must be read before the inner service is called, so the
        // service that `poll_ready` readied goes into the future and a clone
        // stays here for the next request.
        let clone = self.inner.clone();
        let readied = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::reading(readied, request, self.config, Arc::clone(&self.table))
    }
}

/// Whether a request may carry ids that the session's other requests could
/// collide with: a JSON POST in a legacy session. Everything else passes
/// untouched, without its body being read.
fn is_tracked_candidate<B>(request: &Request<B>) -> bool {
    let headers = request.headers();
    request.method() == Method::POST
        && headers.contains_key(&MCP_SESSION_ID)
        && headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| media_type(value).eq_ignore_ascii_case("application/json"))
        && !headers
            .get(&MCP_PROTOCOL_VERSION)
            .is_some_and(|version| is_sessionless_revision(version.as_bytes()))
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
    /// Answer with this response; the inner service is not called.
    Answer(Response<Full<Bytes>>),
}

/// Peeks at a tracked POST's body, asks the session table, and builds the
/// request to forward (with remapped ids spliced in) or the guard's answer.
pub(crate) fn prepare<B>(
    mut parts: http::request::Parts,
    body: Bytes,
    trailers: Option<HeaderMap>,
    config: &Config,
    table: &Arc<Table>,
) -> Prepared<B> {
    let untracked = |parts, body, trailers| Prepared::Forward {
        request: Request::from_parts(parts, RequestBody::buffered(body, trailers)),
        in_flight: None,
        restore: false,
    };
    // Not JSON, or JSON we cannot read as JSON-RPC: the inner server gives its
    // own error for it.
    let Some(peeked) = peek(&body) else {
        return untracked(parts, body, trailers);
    };
    // The peeker only hands out ranges of valid JSON tokens, so they are UTF-8.
    let (id_ranges, ids): (Vec<Range<usize>>, Vec<&str>) = peeked
        .messages()
        .iter()
        .filter(|message| message.kind == Kind::Request)
        .filter_map(|message| {
            let range = message.id.clone()?;
            let text = std::str::from_utf8(&body[range.clone()]).ok()?;
            Some((range, text))
        })
        .unzip();
    let session = parts
        .headers
        .get(&MCP_SESSION_ID)
        .map(HeaderValue::as_bytes);
    let (Some(session), false) = (session, ids.is_empty()) else {
        return untracked(parts, body, trailers);
    };
    let is_batch = matches!(peeked, Peeked::Batch(_));

    match table.admit(
        session,
        &ids,
        config.on_duplicate,
        config.max_in_flight_per_session,
    ) {
        Admission::OverCapacity => {
            tracing::warn!(
                session = %table.session_tag(session),
                limit = config.max_in_flight_per_session,
                "session at its in-flight limit; request refused"
            );
            let status = StatusCode::TOO_MANY_REQUESTS;
            let code = reply::SERVER_ERROR;
            let message = reply::OVER_CAPACITY_MESSAGE;
            Prepared::Answer(if is_batch {
                reply::batch(status, code, ids.iter().map(|id| (*id, message)))
            } else {
                reply::single(status, ids[0], code, message)
            })
        }
        Admission::Duplicate { colliding } => {
            for (id, _) in ids.iter().zip(&colliding).filter(|(_, hit)| **hit) {
                tracing::warn!(
                    policy = ?config.on_duplicate,
                    id = %loggable(id),
                    session = %table.session_tag(session),
                    "request id already in flight in this session; rejected"
                );
            }
            let status = config.reject_status;
            let code = reply::INVALID_REQUEST;
            Prepared::Answer(if is_batch {
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
            })
        }
        Admission::Admitted { guard, routes } => {
            let mut edits = Vec::new();
            for ((id, range), route) in ids.iter().zip(&id_ranges).zip(routes) {
                if let Route::Remapped {
                    server_id,
                    duplicate,
                } = route
                {
                    if duplicate {
                        tracing::warn!(
                            policy = ?config.on_duplicate,
                            id = %loggable(id),
                            session = %table.session_tag(session),
                            "request id already in flight in this session; remapped"
                        );
                    }
                    tracing::debug!(
                        id = %loggable(id),
                        server_id = %String::from_utf8_lossy(&server_id),
                        "forwarding with a server-side id"
                    );
                    edits.push((range.clone(), server_id));
                }
            }
            if edits.is_empty() {
                return Prepared::Forward {
                    request: Request::from_parts(parts, RequestBody::buffered(body, trailers)),
                    in_flight: Some(guard),
                    restore: false,
                };
            }
            let rewritten = Bytes::from(splice(&body, &edits));
            parts.headers.remove(TRANSFER_ENCODING);
            parts
                .headers
                .insert(CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
            Prepared::Forward {
                request: Request::from_parts(parts, RequestBody::buffered(rewritten, trailers)),
                in_flight: Some(guard),
                restore: true,
            }
        }
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

/// `413` for a tracked POST over the body limit.
pub(crate) fn body_too_large(limit: usize) -> Response<Full<Bytes>> {
    reply::single(
        StatusCode::PAYLOAD_TOO_LARGE,
        "null",
        reply::INVALID_REQUEST,
        &format!("Invalid Request: request body exceeds the limit of {limit} bytes"),
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
    fn candidates() {
        let json_in_session = [
            ("content-type", "Application/JSON; charset=utf-8"),
            ("MCP-Session-Id", "s"),
        ];
        assert!(is_tracked_candidate(&request(
            Method::POST,
            &json_in_session
        )));
        assert!(!is_tracked_candidate(&request(
            Method::GET,
            &json_in_session
        )));
        assert!(!is_tracked_candidate(&request(
            Method::POST,
            &[("content-type", "application/json")]
        )));
        assert!(!is_tracked_candidate(&request(
            Method::POST,
            &[("content-type", "text/plain"), ("mcp-session-id", "s")]
        )));
        let mut sessionless = json_in_session.to_vec();
        sessionless.push(("mcp-protocol-version", "2026-07-28"));
        assert!(!is_tracked_candidate(&request(Method::POST, &sessionless)));
        let mut legacy = json_in_session.to_vec();
        legacy.push(("mcp-protocol-version", "2025-11-25"));
        assert!(is_tracked_candidate(&request(Method::POST, &legacy)));
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
