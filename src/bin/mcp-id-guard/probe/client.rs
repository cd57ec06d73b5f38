//! The probe's MCP client: one HTTP/1.1 connection per request, so that
//! concurrent requests really run side by side at the server and a request
//! can be abandoned by closing its connection. Reads plain JSON and SSE
//! answers; every read is bounded in bytes and time.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::events::{first_response, EventReader};

/// The largest response body the probe reads (a big `tools/list` fits).
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// How much of an unexpected body a verdict quotes.
const QUOTED_BYTES: usize = 160;

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
        /// The response object.
        message: Value,
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

/// Sends requests to one MCP endpoint, in one session once it has one.
#[derive(Clone)]
pub(super) struct Client {
    target: Arc<Endpoint>,
    /// The operator's `--header`s (values marked sensitive, never shown).
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
    /// Bound of every connect and every exchange.
    pub(super) timeout: Duration,
    session: Option<HeaderValue>,
    protocol: Option<HeaderValue>,
}

impl Client {
    pub(super) fn new(
        target: Endpoint,
        headers: Vec<(HeaderName, HeaderValue)>,
        timeout: Duration,
    ) -> Self {
        Self {
            target: Arc::new(target),
            headers: Arc::new(headers),
            timeout,
            session: None,
            protocol: None,
        }
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
        tokio::time::timeout(self.timeout, open)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "cannot connect to {} within {:?}",
                    self.target.connect, self.timeout
                ))
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

    /// Sends `request` on `connection` and reads its answer, all within the
    /// timeout. Also returns the response's `Mcp-Session-Id`.
    pub(super) async fn send(
        &self,
        connection: &mut ClientConnection,
        request: Request<Full<Bytes>>,
    ) -> (Reply, Option<HeaderValue>) {
        let exchange = async {
            let response = match connection.sender.send_request(request).await {
                Ok(response) => response,
                Err(error) => return (Reply::Lost(format!("request failed: {error}")), None),
            };
            let session = response.headers().get(SESSION_ID).cloned();
            (read_reply(response).await, session)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or((Reply::Hung, None))
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

/// Reads a response until its first JSON-RPC response (SSE) or its end.
async fn read_reply(response: http::Response<Incoming>) -> Reply {
    let status = response.status().as_u16();
    let sse = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().starts_with("text/event-stream"));
    let mut body = response.into_body();
    let mut events = EventReader::default();
    let mut whole = BytesMut::new();
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Err(error)) => return Reply::Lost(format!("HTTP {status}, body failed: {error}")),
            Some(Ok(frame)) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if whole.len() + data.len() > MAX_BODY_BYTES {
            return Reply::Lost(format!("HTTP {status}, body over {MAX_BODY_BYTES} bytes"));
        }
        if sse {
            if let Some(message) = events.feed(&data) {
                return Reply::Answer { status, message };
            }
        }
        whole.extend_from_slice(&data);
    }
    if let Some(message) = serde_json::from_slice::<Value>(&whole)
        .ok()
        .and_then(first_response)
    {
        return Reply::Answer { status, message };
    }
    if sse && status < 300 {
        return Reply::Lost(format!("HTTP {status}, the stream ended without an answer"));
    }
    let text = String::from_utf8_lossy(&whole[..whole.len().min(QUOTED_BYTES)]).into_owned();
    Reply::Status { status, body: text }
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
