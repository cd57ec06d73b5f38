//! The probe's MCP client: one HTTP/1.1 connection per request, so that
//! concurrent requests really run side by side at the server and a request
//! can be abandoned by closing its connection. Reads plain JSON and SSE
//! answers as they stream (only what the verdicts need is kept), resumes an
//! SSE stream the server closed before its answer (SEP-1699: `GET` with
//! `Last-Event-ID`), and bounds every read in bytes and time, and the whole
//! run by its [`RunLimit`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::events::{resume_header, EventId, EventReader};
use super::scan::{Answer, Scanner};

/// The most bytes the probe reads of one answer (a big `tools/list` fits);
/// they are read as they come, not held.
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// How much of an unexpected body a verdict quotes.
const QUOTED_BYTES: usize = 160;
/// How many times one request's stream is resumed before the probe gives
/// up on its answer.
const MAX_RESUMPTIONS: u32 = 16;
/// The header that resumes a stream.
const LAST_EVENT_ID: &str = "last-event-id";

/// The header that carries the session.
pub(super) const SESSION_ID: &str = "mcp-session-id";
/// The header that carries the negotiated protocol revision.
const PROTOCOL_VERSION: &str = "mcp-protocol-version";

/// Where the probe sends its requests, from the URL it was given.
#[derive(Debug)]
pub(super) struct Endpoint {
    /// `host:port` to connect to.
    connect: String,
    /// The `Host` header of ordinary requests.
    pub(super) authority: String,
    /// The port, for the rebound `Host` of the host check.
    pub(super) port: u16,
    /// Path and query of the MCP endpoint.
    path: String,
}

impl Endpoint {
    /// An `http://host[:port]/path` URL.
    pub(super) fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|error| format!("{url:?} is not a URL: {error}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(
                    "https URLs are not supported (the binary has no TLS): probe the server's \
                     plain-HTTP listener, or through a local port forward"
                        .to_owned(),
                )
            }
            _ => return Err(format!("{url:?}: give an http:// URL of the MCP endpoint")),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{url:?} names no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host();
        Ok(Self {
            connect: format!("{host}:{port}"),
            authority: authority.as_str().to_owned(),
            port,
            path: uri
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |path| path.as_str().to_owned()),
        })
    }
}

/// What one request got back.
#[derive(Debug, Clone)]
pub(super) enum Reply {
    /// A JSON-RPC response (the first one in an SSE stream).
    Answer {
        /// HTTP status.
        status: u16,
        /// What the probe keeps of the response.
        answer: Answer,
    },
    /// A complete HTTP response with no JSON-RPC response in it, such as
    /// `202 Accepted` or a plain-text refusal.
    Status {
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// Nothing within the timeout.
    Hung,
    /// The probe's run limit came before the answer (or the timeout).
    OutOfTime,
    /// The connection failed or closed, or the stream ended, before an answer.
    Lost(String),
}

/// An open connection; closed (the request on it abandoned) when dropped.
pub(super) struct ClientConnection {
    sender: SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl ClientConnection {
    /// Waits (bounded) until another request may go on it; false when it
    /// closed, as it does after an answer read only up to its JSON-RPC
    /// response.
    pub(super) async fn is_ready(&mut self, within: Duration) -> bool {
        matches!(
            tokio::time::timeout(within, self.sender.ready()).await,
            Ok(Ok(()))
        )
    }
}

impl Drop for ClientConnection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long the whole probe may run: a fixed number of `--timeout`s from
/// its start, which a check may extend by what it knows it needs (the
/// reuse-after-abandon check, by its tool's time).
#[derive(Debug)]
pub(super) struct RunLimit {
    start: Instant,
    allowed_millis: AtomicU64,
}

impl RunLimit {
    pub(super) fn new(allowed: Duration) -> Self {
        Self {
            start: Instant::now(),
            allowed_millis: AtomicU64::new(millis(allowed)),
        }
    }

    /// Time left; zero once the limit has passed.
    fn left(&self) -> Duration {
        let allowed = Duration::from_millis(self.allowed_millis.load(Ordering::Relaxed));
        allowed.saturating_sub(self.start.elapsed())
    }

    /// Gives the run `more` time.
    pub(super) fn extend(&self, more: Duration) {
        self.allowed_millis
            .fetch_add(millis(more), Ordering::Relaxed);
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Sends requests to one MCP endpoint, in one session once it has one.
#[derive(Clone)]
pub(super) struct Client {
    target: Arc<Endpoint>,
    /// The operator's `--header`s (values marked sensitive, never shown).
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
    /// Bound of every connect and every exchange.
    pub(super) timeout: Duration,
    /// Bound of the whole run, shared by every clone.
    pub(super) run: Arc<RunLimit>,
    session: Option<HeaderValue>,
    protocol: Option<HeaderValue>,
}

impl Client {
    pub(super) fn new(
        target: Endpoint,
        headers: Vec<(HeaderName, HeaderValue)>,
        timeout: Duration,
        run: Duration,
    ) -> Self {
        Self {
            target: Arc::new(target),
            headers: Arc::new(headers),
            timeout,
            run: Arc::new(RunLimit::new(run)),
            session: None,
            protocol: None,
        }
    }

    /// How long the next wait may last, and whether the run limit (not
    /// the timeout) sets it.
    fn wait_limit(&self) -> (Duration, bool) {
        let left = self.run.left();
        if left < self.timeout {
            (left, true)
        } else {
            (self.timeout, false)
        }
    }

    /// Whether the run limit has passed.
    pub(super) fn out_of_time(&self) -> bool {
        self.run.left().is_zero()
    }

    /// Sleeps for `pause`, or until the run limit.
    pub(super) async fn pause(&self, pause: Duration) {
        tokio::time::sleep(pause.min(self.run.left())).await;
    }

    pub(super) fn target(&self) -> &Endpoint {
        &self.target
    }

    /// This client in the session `session`, speaking revision `protocol`.
    pub(super) fn in_session(
        &self,
        session: Option<HeaderValue>,
        protocol: Option<HeaderValue>,
    ) -> Self {
        Self {
            session,
            protocol,
            ..self.clone()
        }
    }

    pub(super) fn has_session(&self) -> bool {
        self.session.is_some()
    }

    /// Opens a connection (bounded by the timeout).
    pub(super) async fn connect(&self) -> Result<ClientConnection, String> {
        let open = async {
            let stream = TcpStream::connect(&self.target.connect)
                .await
                .map_err(|error| format!("cannot connect to {}: {error}", self.target.connect))?;
            // Small requests go out at once, not after Nagle's delay.
            let _ = stream.set_nodelay(true);
            let (sender, connection) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|error| format!("HTTP handshake failed: {error}"))?;
            let task = tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(ClientConnection { sender, task })
        };
        let (limit, by_run) = self.wait_limit();
        tokio::time::timeout(limit, open).await.unwrap_or_else(|_| {
            Err(if by_run {
                "the probe ran out of time".to_owned()
            } else {
                format!(
                    "cannot connect to {} within {:?}",
                    self.target.connect, self.timeout
                )
            })
        })
    }

    /// A POST of `message`, with `extra` headers replacing the usual ones.
    pub(super) fn post(
        &self,
        message: &Value,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Request<Full<Bytes>> {
        let body = Bytes::from(serde_json::to_vec(message).unwrap_or_default());
        let mut request = self.request(Method::POST, Full::new(body), extra);
        request
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        request
    }

    fn request(
        &self,
        method: Method,
        body: Full<Bytes>,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Request<Full<Bytes>> {
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = self
            .target
            .path
            .parse()
            .unwrap_or_else(|_| Uri::from_static("/"));
        let headers = request.headers_mut();
        if let Ok(host) = HeaderValue::from_str(&self.target.authority) {
            headers.insert(HOST, host);
        }
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(session) = &self.session {
            headers.insert(SESSION_ID, session.clone());
        }
        if let Some(protocol) = &self.protocol {
            headers.insert(PROTOCOL_VERSION, protocol.clone());
        }
        for (name, value) in self.headers.iter().chain(extra) {
            headers.insert(name.clone(), value.clone());
        }
        request
    }

    /// Sends `request` on `connection` and reads its answer, resuming its
    /// stream if the server closes it before the answer, all within the
    /// timeout. Also returns the response's `Mcp-Session-Id`.
    pub(super) async fn send(
        &self,
        connection: &mut ClientConnection,
        request: Request<Full<Bytes>>,
    ) -> (Reply, Option<HeaderValue>) {
        let (limit, by_run) = self.wait_limit();
        let mut session = None;
        let exchange = async {
            let response = match connection.sender.send_request(request).await {
                Ok(response) => response,
                Err(error) => return Reply::Lost(format!("request failed: {error}")),
            };
            session = response.headers().get(SESSION_ID).cloned();
            let mut read = read_reply(response, None).await;
            let mut resumed = 0;
            loop {
                let (last_event_id, retry) = match read {
                    Read::Reply(reply) => return reply,
                    Read::Ended {
                        last_event_id,
                        retry,
                    } => (last_event_id, retry),
                };
                if resumed == MAX_RESUMPTIONS {
                    return Reply::Lost(format!(
                        "resumed {MAX_RESUMPTIONS} times without an answer"
                    ));
                }
                resumed += 1;
                read = match self.resume((last_event_id, retry)).await {
                    Ok(read) => read,
                    Err(why) => return Reply::Lost(why),
                };
            }
        };
        let reply = match tokio::time::timeout(limit, exchange).await {
            Ok(reply) => reply,
            Err(_) if by_run => Reply::OutOfTime,
            Err(_) => Reply::Hung,
        };
        (reply, session)
    }

    /// SEP-1699: the server closed a stream after an event with an id
    /// (typically an empty priming event) before the answer; after its
    /// `retry` pause, `GET` with `Last-Event-ID` goes on with the stream.
    async fn resume(&self, from: (HeaderValue, Duration)) -> Result<Read, String> {
        let (last_event_id, retry) = from.clone();
        self.pause(retry).await;
        let mut connection = self.connect().await?;
        let name = HeaderName::from_static(LAST_EVENT_ID);
        let request = self.request(
            Method::GET,
            Full::new(Bytes::new()),
            &[(name, last_event_id)],
        );
        let response = connection
            .sender
            .send_request(request)
            .await
            .map_err(|error| format!("resuming the stream failed: {error}"))?;
        Ok(match read_reply(response, Some(from)).await {
            Read::Reply(Reply::Status { status, body }) => Read::Reply(Reply::Lost(format!(
                "resuming the stream (GET with Last-Event-ID) got HTTP {status}: {body:?}"
            ))),
            read => read,
        })
    }

    /// Connects and sends `message` (see [`send`](Self::send)).
    pub(super) async fn call(&self, message: &Value, extra: &[(HeaderName, HeaderValue)]) -> Reply {
        match self.connect().await {
            Ok(mut connection) => {
                self.send(&mut connection, self.post(message, extra))
                    .await
                    .0
            }
            Err(error) => Reply::Lost(error),
        }
    }

    /// Ends the session (DELETE); what the server answers does not matter.
    pub(super) async fn end_session(&self) {
        if self.session.is_none() {
            return;
        }
        if let Ok(mut connection) = self.connect().await {
            let request = self.request(Method::DELETE, Full::new(Bytes::new()), &[]);
            let _ = self.send(&mut connection, request).await;
        }
    }
}

/// How a response ended.
enum Read {
    Reply(Reply),
    /// An SSE stream ended without an answer after an event with an id:
    /// resume from it after `retry`.
    Ended {
        last_event_id: HeaderValue,
        retry: Duration,
    },
}

/// Reads a response as it streams, until its first JSON-RPC response (an
/// SSE event, or a JSON body's message) or its end. Keeps what
/// [`Scanner`] keeps and the first [`QUOTED_BYTES`] of the body. A resumed
/// stream that gives no event id of its own resumes from where the last
/// one did (`carried`).
async fn read_reply(
    response: http::Response<Incoming>,
    carried: Option<(HeaderValue, Duration)>,
) -> Read {
    let status = response.status().as_u16();
    let sse = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().starts_with("text/event-stream"));
    let mut body = response.into_body();
    let mut events = EventReader::default();
    let mut json = Scanner::default();
    let mut quoted = Vec::new();
    let mut read = 0;
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Err(error)) => {
                return Read::Reply(Reply::Lost(format!("HTTP {status}, body failed: {error}")))
            }
            Some(Ok(frame)) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        read += data.len();
        if read > MAX_BODY_BYTES {
            return Read::Reply(Reply::Lost(format!(
                "HTTP {status}, body over {MAX_BODY_BYTES} bytes"
            )));
        }
        let room = QUOTED_BYTES.saturating_sub(quoted.len());
        quoted.extend_from_slice(&data[..room.min(data.len())]);
        let answer = if sse {
            events.feed(&data)
        } else {
            json.feed(&data)
        };
        if let Some(answer) = answer {
            return Read::Reply(Reply::Answer { status, answer });
        }
    }
    if !sse {
        if let Some(answer) = json.finish() {
            return Read::Reply(Reply::Answer { status, answer });
        }
    }
    if sse && status < 300 {
        let id = events.last_event_id();
        let resume_from = match (resume_header(id), carried) {
            (Ok(last_event_id), carried) => Ok((
                last_event_id,
                events
                    .retry()
                    .or(carried.map(|(_, retry)| retry))
                    .unwrap_or_default(),
            )),
            (Err(_), Some((last_event_id, retry))) if *id == EventId::None => {
                Ok((last_event_id, events.retry().unwrap_or(retry)))
            }
            (Err(why), _) => Err(why),
        };
        return match resume_from {
            Ok((last_event_id, retry)) => Read::Ended {
                last_event_id,
                retry,
            },
            Err(why) => Read::Reply(Reply::Lost(format!(
                "HTTP {status}, the stream ended without an answer ({why})"
            ))),
        };
    }
    let text = String::from_utf8_lossy(&quoted).into_owned();
    Read::Reply(Reply::Status { status, body: text })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let target = Endpoint::parse("http://127.0.0.1:8000/mcp?x=1").unwrap();
        assert_eq!(
            (target.connect.as_str(), target.port, target.path.as_str()),
            ("127.0.0.1:8000", 8000, "/mcp?x=1")
        );
        assert_eq!(Endpoint::parse("http://localhost/").unwrap().port, 80);
        assert!(Endpoint::parse("https://example.com/mcp").is_err());
        assert!(Endpoint::parse("example.com/mcp").is_err());
    }
}
