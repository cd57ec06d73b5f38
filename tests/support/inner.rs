//! An in-process inner service for the guard to wrap, for the tests that
//! drive [`IdGuard`](mcp_id_guard::IdGuard) directly: it records every
//! request it receives and answers each JSON-RPC request it can read with
//! `{"jsonrpc":"2.0","id":<id it saw>,"result":{}}` (an array for a batch;
//! `202` and no body when it finds no request). A request whose method is
//! `"hold"` reports its id on [`Probe::entered`] and waits until the test
//! lets it go with [`Probe::release`].

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use mcp_id_guard::guard::GuardRequestBody as RequestBody;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, Notify, Semaphore};
use tower::BoxError;

use super::wait::within;

/// One request as the inner service received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Its method.
    pub method: Method,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its whole body.
    pub body: Bytes,
}

/// The recording, echoing inner service.
#[derive(Clone)]
pub struct Echo {
    calls: Arc<AtomicUsize>,
    on_call: Arc<Notify>,
    seen: Arc<Mutex<Vec<Seen>>>,
    entered: mpsc::UnboundedSender<String>,
    gate: Arc<Semaphore>,
}

impl Default for Echo {
    /// An echo without its [`Probe`]: nothing can release a held request.
    fn default() -> Self {
        echo().0
    }
}

impl Echo {
    /// How many times the service was called.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The body of the last request received.
    pub fn last_seen(&self) -> Bytes {
        self.seen
            .lock()
            .unwrap()
            .last()
            .map(|seen| seen.body.clone())
            .expect("a call")
    }

    /// Counts a call (made to this echo as a service, or to a handler that
    /// records on it).
    pub fn count_call(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.on_call.notify_one();
    }

    /// Records a request received.
    pub fn record(&self, method: Method, headers: HeaderMap, body: Bytes) {
        self.seen.lock().unwrap().push(Seen {
            method,
            headers,
            body,
        });
    }
}

/// The test's side of an [`Echo`].
pub struct Probe {
    calls: Arc<AtomicUsize>,
    /// Notified on every call.
    pub on_call: Arc<Notify>,
    seen: Arc<Mutex<Vec<Seen>>>,
    entered: mpsc::UnboundedReceiver<String>,
    gate: Arc<Semaphore>,
}

impl Probe {
    /// How many times the service was called.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Every request received, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until a held request reached the inner service; returns the id
    /// it saw.
    pub async fn entered(&mut self) -> String {
        within(self.entered.recv()).await.expect("echo alive")
    }

    /// Lets `count` held requests go on.
    pub fn release(&self, count: usize) {
        self.gate.add_permits(count);
    }
}

/// An echo and its probe.
pub fn echo() -> (Echo, Probe) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let echo = Echo {
        calls: Arc::default(),
        on_call: Arc::default(),
        seen: Arc::default(),
        entered: sender,
        gate: Arc::new(Semaphore::new(0)),
    };
    let probe = Probe {
        calls: Arc::clone(&echo.calls),
        on_call: Arc::clone(&echo.on_call),
        seen: Arc::clone(&echo.seen),
        entered: receiver,
        gate: Arc::clone(&echo.gate),
    };
    (echo, probe)
}

/// A JSON object's members, each as its exact JSON text.
pub type Fields = BTreeMap<String, Box<RawValue>>;

/// `body` read as one JSON object.
pub fn fields(json: &[u8]) -> Option<Fields> {
    serde_json::from_slice(json).ok()
}

/// The echo of one message, if it is a request (has a method and an id
/// other than `null`).
fn answer_to(message: &Fields) -> Option<String> {
    message.get("method")?;
    let id = message.get("id").filter(|id| id.get() != "null")?;
    Some(format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
        id.get()
    ))
}

/// The echo's answer to a body: `None` when it has no request to answer.
pub fn answer(body: &[u8]) -> Option<String> {
    if let Some(message) = fields(body) {
        return answer_to(&message);
    }
    let batch: Vec<Box<RawValue>> = serde_json::from_slice(body).ok()?;
    let answers: Vec<String> = batch
        .iter()
        .filter_map(|member| fields(member.get().as_bytes()))
        .filter_map(|message| answer_to(&message))
        .collect();
    Some(format!("[{}]", answers.join(",")))
}

/// The echo's response to a body.
pub fn respond(body: &[u8]) -> Response<Full<Bytes>> {
    match answer(body) {
        Some(json) => Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json)))
            .unwrap(),
        None => Response::builder()
            .status(StatusCode::ACCEPTED)
            .body(Full::default())
            .unwrap(),
    }
}

impl<B> tower::Service<Request<RequestBody<B>>> for Echo
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody<B>>) -> Self::Future {
        self.count_call();
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.map_err(Into::into)?.to_bytes();
            this.record(parts.method, parts.headers, body.clone());
            if let Some(message) = fields(&body) {
                if message.get("method").map(|m| m.get()) == Some(r#""hold""#) {
                    let id = message.get("id").map_or("null", |id| id.get());
                    let _ = this.entered.send(id.to_owned());
                    this.gate.acquire().await?.forget();
                }
            }
            Ok(respond(&body))
        })
    }
}
