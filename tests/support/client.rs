//! An MCP streamable-HTTP client (legacy sessions) over reqwest, and the
//! vocabulary the rmcp tests use for what a call got back.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::Value;
use tokio::time::timeout_at;

use super::ids::{is_response, raw_id};
use super::server::McpServer;
use super::sse::{self, Event};
use super::{ACCEPT, OK_TIMEOUT, PROTOCOL_VERSION, WAIT_TIMEOUT};

// ---------------------------------------------------------------------------
// One exchange
// ---------------------------------------------------------------------------

/// One HTTP exchange as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    /// HTTP status, if the response headers arrived.
    pub status: Option<u16>,
    /// `Content-Type` of the response.
    pub content_type: Option<String>,
    /// `Mcp-Session-Id` of the response.
    pub session_id: Option<String>,
    /// The raw body read so far.
    pub body: String,
    /// The JSON text of the first JSON-RPC response in the body: an SSE
    /// event's data, or the JSON body.
    pub response: Option<String>,
    /// The body ended (as opposed to the deadline passing first).
    pub ended: bool,
    /// A transport error, if one ended the exchange.
    pub error: Option<String>,
    /// Time from sending to the end, the deadline, or where reading stopped.
    pub elapsed: Duration,
}

impl Exchange {
    fn is_sse(&self) -> bool {
        self.content_type
            .as_deref()
            .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"))
    }

    /// The body's complete SSE events.
    pub fn events(&self) -> Vec<Event> {
        sse::events(&self.body)
    }

    /// The body parsed as JSON (`Null` if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// When to stop reading a response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadUntil {
    /// At its end (or the deadline).
    End,
    /// As soon as a JSON-RPC response has arrived.
    Response,
}

/// Sends `request` and waits (within `within`) for the response headers.
async fn open(request: reqwest::RequestBuilder, within: Duration) -> Opened {
    let begun = Instant::now();
    let deadline = tokio::time::Instant::now() + within;
    let mut exchange = Exchange::default();
    let response = match timeout_at(deadline, request.send()).await {
        Ok(Ok(response)) => Some(response),
        Ok(Err(error)) => {
            exchange.error = Some(error.to_string());
            None
        }
        Err(_) => None,
    };
    if let Some(response) = &response {
        exchange.status = Some(response.status().as_u16());
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        exchange.content_type = header("content-type");
        exchange.session_id = header("mcp-session-id");
    }
    Opened {
        response,
        exchange,
        begun,
        deadline,
    }
}

/// A response whose headers have arrived (or a failed request), with the
/// deadline of its exchange.
pub struct Opened {
    response: Option<reqwest::Response>,
    exchange: Exchange,
    begun: Instant,
    deadline: tokio::time::Instant,
}

impl Opened {
    /// The HTTP status, if the headers arrived.
    pub fn status(&self) -> Option<u16> {
        self.exchange.status
    }

    /// Reads the body until a JSON-RPC response has arrived, the body ends,
    /// or the deadline passes.
    pub async fn read_response(self) -> Exchange {
        self.read(ReadUntil::Response).await
    }

    /// Reads the body until it ends or the deadline passes.
    pub async fn read_to_end(self) -> Exchange {
        self.read(ReadUntil::End).await
    }

    async fn read(self, stop: ReadUntil) -> Exchange {
        let Self {
            response,
            mut exchange,
            begun,
            deadline,
        } = self;
        let Some(mut response) = response else {
            exchange.elapsed = begun.elapsed();
            return exchange;
        };
        let mut bytes = Vec::new();
        loop {
            match timeout_at(deadline, response.chunk()).await {
                Ok(Ok(Some(chunk))) => {
                    bytes.extend_from_slice(&chunk);
                    exchange.body = String::from_utf8_lossy(&bytes).into_owned();
                    if exchange.response.is_none() && exchange.is_sse() {
                        exchange.response = sse::responses(&exchange.body).into_iter().next();
                        if stop == ReadUntil::Response && exchange.response.is_some() {
                            break;
                        }
                    }
                }
                Ok(Ok(None)) => {
                    exchange.ended = true;
                    break;
                }
                Ok(Err(error)) => {
                    exchange.error = Some(error.to_string());
                    break;
                }
                Err(_) => break,
            }
        }
        if exchange.response.is_none() && exchange.ended && !exchange.is_sse() {
            let body = exchange.body.trim();
            if is_response(body) {
                exchange.response = Some(body.to_owned());
            }
        }
        exchange.elapsed = begun.elapsed();
        exchange
    }
}

// ---------------------------------------------------------------------------
// A session
// ---------------------------------------------------------------------------

/// An initialized MCP session, reached through one endpoint.
#[derive(Clone)]
pub struct Session {
    /// The HTTP client (for requests the session has no method for).
    pub http: reqwest::Client,
    /// The endpoint, `http://…/mcp`.
    pub url: String,
    /// The session id the server assigned.
    pub id: String,
}

impl Session {
    /// `initialize` (no session header), then `notifications/initialized`
    /// with the session id the server assigned.
    pub async fn open(url: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .context("building the HTTP client")?;
        let mut session = Self {
            http,
            url: url.to_owned(),
            id: String::new(),
        };
        let initialize = initialize_message("mcp-id-guard-tests");
        let exchange = open(session.request(initialize.to_string(), None), OK_TIMEOUT)
            .await
            .read_to_end()
            .await;
        let (Some(200), Some(id), Some(_)) =
            (exchange.status, &exchange.session_id, &exchange.response)
        else {
            bail!("initialize failed: {exchange:?}");
        };
        session.id = id.clone();
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let exchange = session.post(initialized.to_owned(), OK_TIMEOUT).await;
        if exchange.status != Some(202) {
            bail!("notifications/initialized failed: {exchange:?}");
        }
        Ok(session)
    }

    /// The same session reached through another endpoint (another replica).
    pub fn via(&self, url: &str) -> Self {
        Self {
            url: url.to_owned(),
            ..self.clone()
        }
    }

    /// The session id the server assigned.
    pub fn session_id(&self) -> &str {
        &self.id
    }

    /// A POST of `body` with the headers MCP requires.
    fn request(&self, body: String, session: Option<&str>) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", ACCEPT)
            .header("content-type", "application/json")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .body(body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request
    }

    /// A POST of `message` in this session, headers set, to send as the test
    /// likes.
    pub fn post_json(&self, message: Value) -> reqwest::RequestBuilder {
        self.request(message.to_string(), Some(&self.id))
    }

    /// A `GET` in this session: the standalone SSE stream, to send as the
    /// test likes.
    pub fn get_stream(&self) -> reqwest::RequestBuilder {
        self.http
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", PROTOCOL_VERSION)
    }

    /// A `DELETE` of this session, to send as the test likes.
    pub fn delete(&self) -> reqwest::RequestBuilder {
        self.http
            .delete(&self.url)
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", PROTOCOL_VERSION)
    }

    /// POSTs a raw body in this session and reads the answer to its end (or
    /// `within`: a wall-clock deadline over the whole exchange, as SSE
    /// keep-alives would defeat any read timeout).
    pub async fn post(&self, body: String, within: Duration) -> Exchange {
        open(self.request(body, Some(&self.id)), within)
            .await
            .read_to_end()
            .await
    }

    /// Calls `echo` with the id `id_json` (sent exactly as written) and
    /// classifies what came back within `within`.
    pub async fn call(&self, id_json: &str, call: &Call, within: Duration) -> Report {
        let exchange = self.post(call.body(id_json), within).await;
        Report::classify(id_json, &call.sentinel, exchange)
    }

    /// Like [`call`](Self::call), but returns as soon as the response event
    /// has arrived, without waiting for the stream to end (as a client that
    /// closes the stream on its response does).
    pub async fn call_eager(&self, id_json: &str, call: &Call, within: Duration) -> Report {
        let request = self.request(call.body(id_json), Some(&self.id));
        let exchange = open(request, within).await.read_response().await;
        Report::classify(id_json, &call.sentinel, exchange)
    }

    /// POSTs `notifications/cancelled` naming `request_id_json` (exact text)
    /// and returns the exact body sent with the answer.
    pub async fn cancel(&self, request_id_json: &str) -> (String, Exchange) {
        let body = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{request_id_json}}}}}"#
        );
        let exchange = self.post(body.clone(), OK_TIMEOUT).await;
        (body, exchange)
    }

    /// POSTs a call, reads its SSE stream up to the first complete event
    /// (rmcp's priming event, which carries an event id) and then drops the
    /// response, closing the connection: a client that lost its POST stream.
    pub async fn post_then_drop_after_first_event(
        &self,
        id_json: &str,
        call: &Call,
    ) -> anyhow::Result<(Exchange, Event)> {
        let deadline = tokio::time::Instant::now() + OK_TIMEOUT;
        let request = self.request(call.body(id_json), Some(&self.id)).send();
        let mut response = timeout_at(deadline, request).await??;
        let mut exchange = Exchange {
            status: Some(response.status().as_u16()),
            content_type: response
                .headers()
                .get("content-type")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
            ..Exchange::default()
        };
        let mut bytes = Vec::new();
        loop {
            let Some(chunk) = timeout_at(deadline, response.chunk()).await?? else {
                bail!("the stream ended before its first event: {exchange:?}");
            };
            bytes.extend_from_slice(&chunk);
            exchange.body = String::from_utf8_lossy(&bytes).into_owned();
            if let Some(first) = exchange.events().into_iter().next() {
                drop(response);
                return Ok((exchange, first));
            }
        }
    }

    /// Starts a call, drops its stream after rmcp's priming event and returns
    /// that event's id, from which the stream can be resumed.
    pub async fn start_echo_then_drop(&self, id_json: &str, call: &Call) -> anyhow::Result<String> {
        let (exchange, first) = self.post_then_drop_after_first_event(id_json, call).await?;
        first
            .id
            .with_context(|| format!("no event id on the first SSE event: {exchange:?}"))
    }

    /// `GET` with `Last-Event-ID` in this session: resumes a stream. Returns
    /// once the response head has arrived (rmcp answers only after the
    /// session has re-attached the stream, so events sent from then on
    /// arrive on it); `within` bounds the whole exchange.
    pub async fn resume(&self, last_event_id: &str, within: Duration) -> anyhow::Result<Opened> {
        let request = self.get_stream().header("last-event-id", last_event_id);
        let opened = open(request, within).await;
        if opened.status().is_none() {
            bail!("resume got no response head: {:?}", opened.exchange);
        }
        Ok(opened)
    }
}

// ---------------------------------------------------------------------------
// Calls and what they got back
// ---------------------------------------------------------------------------

/// One `echo` call to make.
#[derive(Debug, Clone)]
pub struct Call {
    /// Unique per server; the result text is `ECHO:<sentinel>`.
    pub sentinel: String,
    /// Work time after the gate, in milliseconds (simulated work).
    pub delay_ms: u64,
    /// Wait for the gate to open first.
    pub hold: bool,
    /// Keep working when cancelled.
    pub ignore_cancel: bool,
}

impl Call {
    /// A call that answers after `delay_ms` (and stops when cancelled).
    pub fn new(sentinel: impl Into<String>, delay_ms: u64) -> Self {
        Self {
            sentinel: sentinel.into(),
            delay_ms,
            hold: false,
            ignore_cancel: false,
        }
    }

    /// A call that answers after `delay_ms` whether or not it is cancelled,
    /// as many real tools do.
    pub fn echo(sentinel: impl Into<String>, delay_ms: u64) -> Self {
        Self {
            ignore_cancel: true,
            ..Self::new(sentinel, delay_ms)
        }
    }

    /// A call that waits for its gate (and stops when cancelled).
    pub fn held(sentinel: impl Into<String>) -> Self {
        Self {
            hold: true,
            ..Self::new(sentinel, 0)
        }
    }

    /// A held call that does not stop when cancelled.
    pub fn stubborn(sentinel: impl Into<String>) -> Self {
        Self {
            ignore_cancel: true,
            ..Self::held(sentinel)
        }
    }

    /// The `tools/call` body with `id_json` written exactly as given.
    pub fn body(&self, id_json: &str) -> String {
        let arguments = serde_json::json!({
            "sentinel": self.sentinel,
            "delay_ms": self.delay_ms,
            "hold": self.hold,
            "ignore_cancel": self.ignore_cancel,
        });
        format!(
            r#"{{"jsonrpc":"2.0","id":{id_json},"method":"tools/call","params":{{"name":"echo","arguments":{arguments}}}}}"#
        )
    }
}

/// What a call got back.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its own result (`ECHO:<own sentinel>`) with exactly the id text sent.
    Own,
    /// Another call's result.
    Wrong {
        /// The sentinel of the result received.
        got: String,
    },
    /// No response, and the stream still open at the deadline.
    Hung,
    /// The stream ended without a JSON-RPC response.
    EndedWithoutResponse,
    /// A non-2xx answer.
    Rejected {
        /// HTTP status.
        status: u16,
        /// `Content-Type` of the answer.
        content_type: Option<String>,
        /// The body, parsed as JSON (`Null` if it is not JSON).
        body: Value,
    },
    /// Anything else (a JSON-RPC error, the own result under another id, a
    /// transport error).
    Other(String),
}

/// One call's outcome and the exchange behind it.
#[derive(Debug, Clone)]
pub struct Report {
    /// The call's sentinel.
    pub sentinel: String,
    /// The id JSON text sent.
    pub sent_id: String,
    /// The classification.
    pub outcome: Outcome,
    /// The exact JSON text of the response's `id`, if a response came.
    pub answered_id: Option<String>,
    /// The raw exchange.
    pub exchange: Exchange,
}

impl Report {
    /// Classifies what `exchange` brought back for a call with `sentinel` and
    /// `sent_id`.
    pub fn classify(sent_id: &str, sentinel: &str, exchange: Exchange) -> Self {
        let answered_id = exchange.response.as_deref().and_then(raw_id);
        let outcome = match (exchange.status, &exchange.response) {
            (Some(status), _) if !(200..300).contains(&status) => Outcome::Rejected {
                status,
                content_type: exchange.content_type.clone(),
                body: exchange.json(),
            },
            (_, Some(response)) => classify_response(sent_id, sentinel, response),
            (_, None) if exchange.error.is_some() => {
                Outcome::Other(format!("transport error: {:?}", exchange.error))
            }
            (_, None) if exchange.ended => Outcome::EndedWithoutResponse,
            (_, None) => Outcome::Hung,
        };
        Self {
            sentinel: sentinel.to_owned(),
            sent_id: sent_id.to_owned(),
            outcome,
            answered_id,
            exchange,
        }
    }

    /// Own result, exact id, and the response stream ended.
    pub fn is_clean_own(&self) -> bool {
        self.outcome == Outcome::Own && self.exchange.ended
    }
}

/// Classifies a JSON-RPC response to the call with `sentinel` and `sent_id`.
pub fn classify_response(sent_id: &str, sentinel: &str, response: &str) -> Outcome {
    let Ok(value) = serde_json::from_str::<Value>(response) else {
        return Outcome::Other(format!("unparsable response {response}"));
    };
    let Some(text) = value
        .pointer("/result/content/0/text")
        .and_then(Value::as_str)
    else {
        return Outcome::Other(format!("response without echo text: {response}"));
    };
    let Some(got) = text.strip_prefix("ECHO:") else {
        return Outcome::Other(format!("unexpected echo text: {response}"));
    };
    if got != sentinel {
        return Outcome::Wrong {
            got: got.to_owned(),
        };
    }
    match raw_id(response) {
        Some(id) if id == sent_id => Outcome::Own,
        id => Outcome::Other(format!(
            "own result but id {id:?} instead of {sent_id}: {response}"
        )),
    }
}

/// Asserts a call got its own result with exactly the id text sent.
#[track_caller]
pub fn assert_own(report: &Report) {
    assert_eq!(
        report.outcome,
        Outcome::Own,
        "{}: expected its own result: {report:#?}",
        report.sentinel
    );
    assert_eq!(
        report.answered_id.as_deref(),
        Some(report.sent_id.as_str()),
        "{}: the id must come back byte for byte",
        report.sentinel
    );
}

/// Counts of outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Own result with the id sent.
    pub own: usize,
    /// Another call's result.
    pub wrong: usize,
    /// No answer in time.
    pub hung: usize,
    /// Refused (a non-2xx answer, or a JSON-RPC error through the proxy).
    pub rejected: usize,
    /// Anything else (an ended stream without a response included).
    pub other: usize,
}

/// The tally column a call's answer falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// Its own result.
    Own,
    /// Another call's result.
    Wrong,
    /// No answer in time.
    Hung,
    /// Refused.
    Rejected,
    /// Anything else.
    Other,
}

/// What a [`Tally`] counts: anything that says which column it falls in.
pub trait Counted {
    /// This answer's column.
    fn column(&self) -> Column;
}

impl Counted for Report {
    fn column(&self) -> Column {
        match self.outcome {
            Outcome::Own => Column::Own,
            Outcome::Wrong { .. } => Column::Wrong,
            Outcome::Hung => Column::Hung,
            Outcome::Rejected { .. } => Column::Rejected,
            Outcome::EndedWithoutResponse | Outcome::Other(_) => Column::Other,
        }
    }
}

impl Tally {
    /// Counts `answers`.
    pub fn of<T: Counted>(answers: &[T]) -> Self {
        let mut tally = Self::default();
        for answer in answers {
            let count = match answer.column() {
                Column::Own => &mut tally.own,
                Column::Wrong => &mut tally.wrong,
                Column::Hung => &mut tally.hung,
                Column::Rejected => &mut tally.rejected,
                Column::Other => &mut tally.other,
            };
            *count += 1;
        }
        tally
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "own {}, wrong {}, hung {}, rejected {}, other {}",
            self.own, self.wrong, self.hung, self.rejected, self.other
        )
    }
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

/// The `i`-th of `n` distinct delays in `0..300` ms, in shuffled order, so the
/// calls of a burst finish in an order unrelated to the order they were sent.
pub fn burst_delay(i: usize, n: usize) -> u64 {
    // 7 is coprime with the burst sizes used (12), so this is a permutation.
    let step = 300 / n as u64;
    ((i * 7) % n) as u64 * step
}

/// Sends `n` concurrent `echo` calls, all with the id `id_json`, in one
/// session, each bounded by `within`. Sentinels are `<tag>-<i>`.
pub async fn burst(
    session: &Session,
    tag: &str,
    id_json: &str,
    n: usize,
    within: Duration,
) -> Vec<Report> {
    let calls: Vec<Call> = (0..n)
        .map(|i| Call::echo(format!("{tag}-{i:02}"), burst_delay(i, n)))
        .collect();
    futures::future::join_all(calls.iter().map(|call| session.call(id_json, call, within))).await
}

/// The pair case: A (held) is sent with `id_a`; once it has started, B (held)
/// is sent with `id_b`. If `b_reaches_server`, once B has started too, A is
/// released and, after A's answer (or hang), B. Otherwise B is expected to be
/// answered by the guard while A is still held, and A is released after B's
/// answer. Returns `(A, B)`.
pub async fn pair(
    server: &McpServer,
    session: &Session,
    tag: &str,
    (id_a, id_b): (&str, &str),
    b_reaches_server: bool,
    within: Duration,
) -> anyhow::Result<(Report, Report)> {
    let a = Call::stubborn(format!("{tag}-A"));
    let b = Call::stubborn(format!("{tag}-B"));
    let task_a = tokio::spawn({
        let (session, a, id_a) = (session.clone(), a.clone(), id_a.to_owned());
        async move { session.call(&id_a, &a, within).await }
    });
    server.started.wait_for(&a.sentinel, WAIT_TIMEOUT).await?;
    let task_b = tokio::spawn({
        let (session, b, id_b) = (session.clone(), b.clone(), id_b.to_owned());
        async move { session.call(&id_b, &b, within).await }
    });
    if b_reaches_server {
        server.started.wait_for(&b.sentinel, WAIT_TIMEOUT).await?;
        server.gates.release(&a.sentinel);
        let report_a = task_a.await?;
        server.gates.release(&b.sentinel);
        let report_b = task_b.await?;
        Ok((report_a, report_b))
    } else {
        // B must be answered while A is still held (if it wrongly reaches the
        // server it parks on its gate and ends up hung).
        let report_b = task_b.await?;
        server.gates.release(&a.sentinel);
        let report_a = task_a.await?;
        server.gates.release(&b.sentinel);
        Ok((report_a, report_b))
    }
}

/// The `initialize` request a client (or a rebound page) sends first, from
/// the client named `client`.
pub fn initialize_message(client: &str) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": { "name": client, "version": "0" }
        }
    })
}
