use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::ACCEPT_ENCODING;
use http::{HeaderMap, Method, Request, Response};
use http_body::Body;
use http_body_util::Full;
use tower_service::Service;

use crate::guard::body::{RequestBody, ResponseBody, Restoring};
use crate::guard::exchange::{Exchange, GuardDecision, WantsExchange, WantsRequestIds};
use crate::guard::future::ResponseFuture;
use crate::guard::layer::IdGuardLayer;
use crate::table::config::Config;
use crate::table::Stats;
use crate::table::{Resumed, Table};
use crate::wire::answer;
use crate::wire::method::McpMethod;
use crate::wire::protocol::{has_media_type, RequestHeaders, MCP_SESSION_ID};

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
/// let server = service_fn(|request: Request<mcp_id_guard::guard::GuardRequestBody<Full<Bytes>>>| async move {
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

    inner_accessors!();
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
        let record = request.extensions().get::<WantsExchange>().is_some();
        self.respond(request, record)
    }
}

impl<S> IdGuard<S> {
    /// What `call` does with a request, whatever becomes of its [`Exchange`].
    /// `record`: a layer outside reads the [`Exchange`] (only then is one
    /// built).
    fn respond<ReqBody, ResBody>(
        &mut self,
        mut request: Request<ReqBody>,
        record: bool,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Clone,
    {
        let decided = head(&mut request, &self.config, &self.table, record);
        if record && matches!(decided, Head::Untouched { .. } | Head::Stream(_)) {
            // The trace layer's handle on its span is for the guard: a
            // server that kept the request's extensions (rmcp hands them to
            // its tools) would keep the span open.
            request.extensions_mut().remove::<WantsRequestIds>();
        }
        match decided {
            Head::Untouched { exchange } => self.untouched(request, exchange, record),
            Head::Answer { response, exchange } => {
                ResponseFuture::answered(response, exchange, record)
            }
            Head::Stream(restoring) => ResponseFuture::called(
                self.inner.call(request.map(RequestBody::new)),
                Some(restoring),
                Exchange::default(),
                record,
            ),
            Head::Read {
                headers,
                watch_start,
            } => self.read_first(request, headers, watch_start, record),
        }
    }
}

/// What the guard does with a request, decided on its head: the first step
/// of every face (the tower service here, [`crate::core`] for the others).
pub(crate) enum Head {
    /// Call the inner service with the request as it came; read neither it
    /// nor its response.
    Untouched { exchange: Exchange },
    /// Answer in the server's place.
    Answer {
        response: Response<Full<Bytes>>,
        exchange: Exchange,
    },
    /// A `GET` stream: call the inner service with the request (its
    /// `Accept-Encoding` removed), read the response as `Restoring` says.
    Stream(Restoring),
    /// Read the body first, then [`decide`](crate::guard::future::decide).
    /// `watch_start`: a POST without a session read only to see whether it
    /// is an `initialize` (during the restart window).
    Read {
        headers: RequestHeaders,
        watch_start: bool,
    },
}

/// Decides on a request's head. A stream's request loses its
/// `Accept-Encoding` (restoring needs the stream as the server wrote it).
/// `record`: a layer outside reads the [`Exchange`].
pub(crate) fn head<B>(
    request: &mut Request<B>,
    config: &Config,
    table: &Arc<Table>,
    record: bool,
) -> Head {
    let method = request.method();
    // Outside a session nothing is tracked; unless a layer outside wants
    // the account of the POST or the restart window is open, none of the
    // headers read below changes what happens, and one lookup costs a
    // fraction of reading them all.
    if !record && !request.headers().contains_key(&MCP_SESSION_ID) && !table.watches_starts(config)
    {
        return Head::Untouched {
            exchange: Exchange::default(),
        };
    }
    let headers = RequestHeaders::read(request.headers());
    let handling = handling(method, &headers);
    // The guard decides on the request the server will see: one whose
    // `Connection` names a header it reads would reach the server
    // without it (see `RequestHeaders::hides_decided_on`).
    // Nor one whose session id a later parser reads otherwise.
    let refusal = match () {
        _ if !headers.in_legacy_session() => None,
        _ if headers.hides_decided_on => Some(answer::hides_decided_on()),
        _ if headers.odd_session => Some(answer::odd_session()),
        _ => None,
    };
    if let Some(response) = refusal {
        let exchange = if method == Method::POST {
            Exchange::one(McpMethod::Other, GuardDecision::Refused)
        } else {
            Exchange::default()
        };
        return Head::Answer { response, exchange };
    }
    // A tracked POST is refused once its body is read, with its ids.
    if handling != Handling::Read
        && headers.in_legacy_session()
        && headers
            .session
            .as_ref()
            .is_some_and(|id| id.len() > config.max_session_id_bytes)
    {
        return Head::Answer {
            response: answer::session_id_too_long(&[], false, config.max_session_id_bytes),
            exchange: Exchange::default(),
        };
    }
    match handling {
        // During the restart window the guard reads `initialize`
        // requests, to learn from their answers which sessions start.
        // The window's flag first: it is off for nearly every request.
        Handling::Untouched
            if table.watches_starts(config)
                && may_start_session(method, request.headers(), &headers)
                && !declared_length_over(&headers, config.max_body_bytes) =>
        {
            Head::Read {
                headers,
                watch_start: true,
            }
        }
        Handling::Untouched => {
            // A POST the guard does not read counts as one message, by
            // the method its `Mcp-Method` header names (2026-07-28); one
            // without a session whose answer starts one is `initialize`.
            let exchange = match () {
                _ if !record || method != Method::POST => Exchange::default(),
                _ if headers.session.is_none() => Exchange::sessionless(headers.method),
                _ => Exchange::one(headers.method, GuardDecision::Passed),
            };
            Head::Untouched { exchange }
        }
        // A standalone or resumed stream may carry (or replay) responses to
        // remapped requests; restoring is stateless, by the id encoding.
        // It may also carry the answer to a request whose own stream the
        // server closed early (SEP-1699 polling): that frees its id.
        Handling::RestoreStream => {
            // Restoring needs the stream as the server wrote it.
            request.headers_mut().remove(ACCEPT_ENCODING);
            // Only a resumed stream replays answers (spec 2025-11-25,
            // resumability); a standalone one carries none. What it
            // resumes is the stream whose last event id the client
            // names; more than one names none.
            let session = headers.session.clone();
            let mut resumed = request.headers().get_all("last-event-id").iter();
            let resumes = match (resumed.next(), resumed.next(), &session) {
                (Some(event_id), None, Some(session)) => Some(Resumed {
                    origin: table.resumed_stream(session.as_bytes(), event_id.as_bytes()),
                    max_table_bytes: config.max_table_bytes,
                }),
                _ => None,
            };
            Head::Stream(Restoring {
                table: Arc::clone(table),
                max_id: config.max_body_bytes,
                restore: true,
                session,
                resumes,
            })
        }
        Handling::Read => {
            let limit = config.max_body_bytes;
            if declared_length_over(&headers, limit) {
                return Head::Answer {
                    response: answer::body_too_large(limit),
                    exchange: Exchange::one(McpMethod::Other, GuardDecision::Refused),
                };
            }
            Head::Read {
                headers,
                watch_start: false,
            }
        }
    }
}

impl<S> IdGuard<S> {
    /// Calls the inner service with the request as it came: the guard reads
    /// neither it nor its response.
    fn untouched<ReqBody>(
        &mut self,
        request: Request<ReqBody>,
        exchange: Exchange,
        record: bool,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
    {
        ResponseFuture::called(
            self.inner.call(request.map(RequestBody::new)),
            None,
            exchange,
            record,
        )
    }

    /// A future that reads the body before it calls the inner service.
    fn read_first<ReqBody>(
        &mut self,
        request: Request<ReqBody>,
        headers: RequestHeaders,
        watch_start: bool,
        record: bool,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<RequestBody<ReqBody>>> + Clone,
    {
        // The body must be read before the inner service is called, so the
        // service that `poll_ready` readied goes into the future and a clone
        // stays here for the next request.
        let clone = self.inner.clone();
        let readied = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::reading(
            readied,
            request,
            headers,
            self.config,
            Arc::clone(&self.table),
            watch_start,
            record,
        )
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
    /// A POST in a legacy session: read the body, it may carry ids that the
    /// session's other requests could collide with.
    Read,
}

fn declared_length_over(headers: &RequestHeaders, limit: usize) -> bool {
    headers
        .content_length
        .is_some_and(|length| length > limit as u64)
}

/// A POST that may be an `initialize` request: JSON, without a session
/// header, in a revision that has sessions. (Some clients send
/// `MCP-Protocol-Version` on `initialize` too, so its presence says nothing.)
fn may_start_session(
    method: &Method,
    request_headers: &HeaderMap,
    headers: &RequestHeaders,
) -> bool {
    method == Method::POST
        && headers.session.is_none()
        && !headers.sessionless
        && has_media_type(request_headers, "application/json")
}

fn handling(method: &Method, headers: &RequestHeaders) -> Handling {
    match *method {
        _ if !headers.in_legacy_session() => Handling::Untouched,
        // Every POST, whatever its `Content-Type`: servers check it loosely
        // (a list such as `application/json, text/plain` passes the Python
        // SDK), so the header cannot tell which bodies a server reads.
        Method::POST => Handling::Read,
        Method::GET => Handling::RestoreStream,
        _ => Handling::Untouched,
    }
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
        let of = |method, headers: &[(&str, &str)]| {
            let request = request(method, headers);
            handling(request.method(), &RequestHeaders::read(request.headers()))
        };
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
            Handling::Read
        );
        // A session POST is read whatever revision it claims: the server
        // routes it into the session by id.
        let mut claims_sessionless = json_in_session.to_vec();
        claims_sessionless.push(("mcp-protocol-version", "2026-07-28"));
        assert_eq!(of(Method::POST, &claims_sessionless), Handling::Read);
        assert_eq!(
            of(
                Method::POST,
                &[
                    ("content-type", "application/json"),
                    ("mcp-protocol-version", "2026-07-28")
                ]
            ),
            Handling::Untouched
        );
        let mut legacy = json_in_session.to_vec();
        legacy.push(("mcp-protocol-version", "2025-11-25"));
        assert_eq!(of(Method::POST, &legacy), Handling::Read);
    }
}
