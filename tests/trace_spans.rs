//! The guard's spans as a subscriber sees them (issue 44's review): each
//! field recorded once, whatever ends the exchange; the span never held open
//! by a server that keeps a request's extensions; a batch's spans and the
//! ids they record bounded; the request span keeps a query's keys out of
//! the logs. Each test failed on the first cut of the decision-time
//! description (`238f704`).
#![cfg(feature = "otel")]

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use mcp_id_guard::trace::McpTraceLayer;
use mcp_id_guard::IdGuardLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use support::lines::Lines;

/// Every value recorded on each span, in order, and whether it closed.
#[derive(Debug, Default, Clone)]
struct SpanLog {
    name: &'static str,
    target: &'static str,
    fields: Vec<(String, String)>,
    closed: bool,
}

impl SpanLog {
    fn values(&self, field: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(name, _)| name == field)
            .map(|(_, value)| value.as_str())
            .collect()
    }
}

#[derive(Clone, Default)]
struct Spans(Arc<Mutex<HashMap<u64, SpanLog>>>);

struct Collect<'a>(&'a mut Vec<(String, String)>);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: LayerContext<'_, S>) {
        let mut log = SpanLog {
            name: attrs.metadata().name(),
            target: attrs.metadata().target(),
            ..SpanLog::default()
        };
        attrs.record(&mut Collect(&mut log.fields));
        self.0.lock().unwrap().insert(id.into_u64(), log);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: LayerContext<'_, S>) {
        if let Some(log) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Collect(&mut log.fields));
        }
    }
    fn on_close(&self, id: Id, _: LayerContext<'_, S>) {
        if let Some(log) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            log.closed = true;
        }
    }
}

impl Spans {
    fn guard_spans(&self) -> Vec<SpanLog> {
        self.0
            .lock()
            .unwrap()
            .values()
            .filter(|log| log.target == "mcp_id_guard::trace" && log.name == "POST")
            .cloned()
            .collect()
    }
}

fn capture() -> (Spans, tracing::subscriber::DefaultGuard) {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    (spans, tracing::subscriber::set_default(subscriber))
}

fn post(session: Option<&str>, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    let mut request = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    request.body(Full::new(body.into())).unwrap()
}

const CALL: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"work","arguments":{}}}"#;

/// An inner service whose response never comes.
#[derive(Clone)]
struct Never;

impl<R> Service<Request<R>> for Never {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Pending<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<R>) -> Self::Future {
        std::future::pending()
    }
}

/// An inner service that fails.
#[derive(Clone)]
struct Fails;

impl<R> Service<Request<R>> for Fails {
    type Response = Response<Full<Bytes>>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, std::io::Error>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<R>) -> Self::Future {
        std::future::ready(Err(std::io::Error::other("upstream down")))
    }
}

/// The guard describes the first message on the span when it decides; when
/// no response comes back (the client went away while the tool ran, or the
/// inner service failed), the span keeps that name, recorded once. Before:
/// renamed `POST`, `otel.name` recorded twice.
#[tokio::test]
async fn a_described_span_whose_response_never_came_keeps_its_name() {
    let (spans, _default) = capture();
    let mut service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(IdGuardLayer::new())
        .service(Never);
    let mut future = ServiceExt::<Request<Full<Bytes>>>::ready(&mut service)
        .await
        .unwrap()
        .call(post(Some("s"), CALL));
    // One poll: the guard reads the body, decides (telling the span), calls
    // the inner service, which never answers. Then the client goes away.
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
    drop(future);

    let guard = spans.guard_spans();
    assert_eq!(guard.len(), 1, "{guard:#?}");
    let span = &guard[0];
    assert!(span.closed);
    assert_eq!(span.values("mcp.method.name"), ["tools/call"]);
    assert_eq!(span.values("otel.name"), ["tools/call work"]);
    assert!(span.values("http.request.method").is_empty());
    assert_eq!(span.values("error.type"), ["response_incomplete"]);
}

#[tokio::test]
async fn a_described_span_whose_service_failed_keeps_its_name() {
    let (spans, _default) = capture();
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(IdGuardLayer::new())
        .service(Fails);
    let result = service.oneshot(post(Some("s"), CALL)).await;
    assert!(result.is_err());
    let guard = spans.guard_spans();
    let span = &guard[0];
    assert_eq!(span.values("mcp.method.name"), ["tools/call"]);
    assert_eq!(span.values("otel.name"), ["tools/call work"]);
}

/// An inner service that keeps the extensions of every request it gets (as
/// a server that hands them to a long-lived task would).
#[derive(Clone, Default)]
struct Keeps(Arc<Mutex<Vec<http::Extensions>>>);

impl<R> Service<Request<R>> for Keeps {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, request: Request<R>) -> Self::Future {
        self.0.lock().unwrap().push(request.extensions().clone());
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        )))))
    }
}

/// Without a guard inside (a configuration `trace` documents: "no guard
/// inside, one span named POST"), or on a route the guard does not cover,
/// the server gets the request's extensions with the layer's slot: a server
/// that keeps them does not keep the span open. Before: it closed only when
/// the server let go.
#[tokio::test]
async fn without_a_guard_inside_the_server_cannot_hold_the_span_open() {
    let (spans, _default) = capture();
    let keeps = Keeps::default();
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .service(keeps.clone());
    let response = service.oneshot(post(Some("s"), CALL)).await.unwrap();
    let _ = response.into_body().collect().await.unwrap();
    let guard = spans.guard_spans();
    assert_eq!(guard.len(), 1);
    assert!(guard[0].closed, "the server's copy holds the span open");
    assert_eq!(keeps.0.lock().unwrap().len(), 1, "the server kept them");
}

/// With the guard inside, the handle never reaches the server (control).
#[tokio::test]
async fn with_the_guard_inside_the_span_closes() {
    let (spans, _default) = capture();
    let keeps = Keeps::default();
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(IdGuardLayer::new())
        .service(keeps.clone());
    for session in [Some("s"), None] {
        let response = service.clone().oneshot(post(session, CALL)).await.unwrap();
        let _ = response.into_body().collect().await.unwrap();
    }
    assert!(spans.guard_spans().iter().all(|span| span.closed));
}

/// A batch is the client's to size: a batch of notifications (not limited
/// by the in-flight cap) within the default 4 MiB body limit opened ~130 000
/// spans for one POST. Now 16, the first counting the rest.
#[tokio::test]
async fn a_batch_opens_at_most_16_spans() {
    let (spans, _default) = capture();
    let keeps = Keeps::default();
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(IdGuardLayer::new())
        .service(keeps);
    let note = r#"{"jsonrpc":"2.0","method":"n"}"#;
    let count = (4 * 1024 * 1024 - 2) / (note.len() + 1);
    let body = format!("[{}]", vec![note; count].join(","));
    assert!(body.len() <= 4 * 1024 * 1024);
    let response = service.oneshot(post(Some("s"), body)).await.unwrap();
    let _ = response.into_body().collect().await.unwrap();
    let guard = spans.guard_spans();
    assert_eq!(guard.len(), 16);
    let undescribed = (count - 16).to_string();
    assert!(
        guard
            .iter()
            .any(|span| span.values("mcp_id_guard.batch.undescribed") == [undescribed.as_str()]),
        "{:?}",
        guard.iter().map(|span| &span.fields).collect::<Vec<_>>()
    );
}

/// In the subscriber the README recommends (each layer filtered on its own,
/// the OpenTelemetry layer at `INFO`), the decision events are not exported
/// as span events of every guard span (nor built, in a process whose one
/// subscriber is this: other tests' subscribers in this binary may leave
/// the callsite's interest cached as enabled). Before, the README filtered
/// the `fmt` layer alone, and every POST exported them.
#[tokio::test]
async fn the_recommended_subscriber_exports_no_decision_event() {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("app"))
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        );
    let _default = tracing::subscriber::set_default(subscriber);
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(IdGuardLayer::new())
        .service(Keeps::default());
    let response = service.oneshot(post(Some("s"), CALL)).await.unwrap();
    let _ = response.into_body().collect().await.unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let guard = spans
        .iter()
        .find(|span| span.name.starts_with("tools/call"))
        .expect("the guard span");
    let events: Vec<_> = guard
        .events
        .iter()
        .map(|event| event.name.to_string())
        .collect();
    assert!(events.is_empty(), "{events:?}");
}

/// A remapped request's server-side id holds the client's id whole
/// (`"mcp-id-guard:<mac>:<serial>:<original>"`): it is cut as the client's
/// id is, in the decision line and in the span. Before, a duplicate with a
/// 1 MiB id wrote a 1 MiB log line and a 1 MiB span attribute.
#[tokio::test]
async fn a_long_duplicate_id_is_cut_in_the_decision_line_and_the_span() {
    let spans = Spans::default();
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::registry().with(spans.clone()).with(
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("mcp_id_guard::decision", tracing::Level::DEBUG),
            ),
    );
    let _default = tracing::subscriber::set_default(subscriber);
    // `tracing` caches whether a callsite is enabled across every thread's
    // subscriber; one set by another test at this moment may have cached the
    // `DEBUG` decision events as disabled: count this one in again.
    tracing::callsite::rebuild_interest_cache();
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(IdGuardLayer::new())
        .service(Keeps::default());
    let id = format!("\"{}\"", "x".repeat(1024 * 1024));
    let call = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
    // The first stays in flight while its response body is unread.
    let first = service
        .clone()
        .oneshot(post(Some("s"), call.clone()))
        .await
        .unwrap();
    let second = service.oneshot(post(Some("s"), call)).await.unwrap();
    let _ = second.into_body().collect().await.unwrap();
    drop(first);

    let text = lines.text();
    let remapped = text
        .lines()
        .find(|line| line.contains("decision=\"remapped\""))
        .expect("the remapped decision line");
    assert!(remapped.len() < 1024, "{}", remapped.len());
    let span = spans
        .guard_spans()
        .into_iter()
        .find(|span| span.values("mcp_id_guard.decision") == ["remapped"])
        .expect("the remapped span");
    let server_id = span.values("mcp_id_guard.server_request_id")[0].len();
    let client_id = span.values("jsonrpc.request.id")[0].len();
    assert!(client_id <= 256);
    assert!(server_id <= 256, "{server_id}");
}

/// Two `McpTraceLayer`s on one request (one on the router, one on the
/// route): both spans are described. Before, the inner one's slot replaced
/// the outer one's, and the outer span was described by nobody.
#[tokio::test]
async fn nested_trace_layers_both_describe_their_spans() {
    let (spans, _default) = capture();
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(McpTraceLayer::new())
        .layer(IdGuardLayer::new())
        .service(Keeps::default());
    let response = service.oneshot(post(Some("s"), CALL)).await.unwrap();
    let _ = response.into_body().collect().await.unwrap();
    let guard = spans.guard_spans();
    assert_eq!(guard.len(), 2);
    let described = guard
        .iter()
        .filter(|span| !span.values("mcp.method.name").is_empty())
        .count();
    assert_eq!(described, 2);
}

/// `trace::request_span` is at `INFO` (tower-http's default span is at
/// `DEBUG`, which the usual filter drops): it records the path, not the
/// query, which may carry a key (`/mcp?api_key=...`). Before, the whole
/// target went into every log line of the request.
#[tokio::test]
async fn the_request_span_keeps_the_query_out_of_the_logs() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let request = Request::post("/mcp?api_key=sk-secret").body(()).unwrap();
    let span = mcp_id_guard::trace::request_span(&request);
    span.in_scope(|| tracing::info!("handled"));
    let text = lines.text();
    assert!(!text.contains("sk-secret"), "{text}");
    assert!(text.contains("path=\"/mcp\""), "{text}");
}

/// In the recommended stack `TimeoutLayer` (inside `McpTraceLayer`, outside
/// the guard) answers `408` for a tool call that outlives `response_head`:
/// the span keeps the name the guard gave it, with the `408`. Before:
/// renamed `POST`, `otel.name` recorded twice.
#[tokio::test]
async fn a_timed_out_tool_call_span_keeps_its_name() {
    let (spans, _default) = capture();
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            http::StatusCode::REQUEST_TIMEOUT,
            std::time::Duration::from_millis(50),
        ))
        .layer(IdGuardLayer::new())
        .service(Never);
    let response = service.oneshot(post(Some("s"), CALL)).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::REQUEST_TIMEOUT);
    let _ = response.into_body().collect().await;
    let guard = spans.guard_spans();
    let span = &guard[0];
    assert_eq!(span.values("mcp.method.name"), ["tools/call"]);
    assert_eq!(span.values("otel.name"), ["tools/call work"]);
    assert_eq!(span.values("http.response.status_code"), ["408"]);
}

/// Control: with the guard inside, no path hands the span handle to a server
/// that keeps every request's extensions (the span closes): the restart
/// window's `initialize` read, a queued duplicate, a body that is no
/// JSON-RPC, a client response, a batch, a session id over the limit.
#[tokio::test]
async fn no_guarded_path_leaks_the_span_handle() {
    use mcp_id_guard::OnDuplicate;
    let (spans, _default) = capture();
    let keeps = Keeps::default();
    let service = ServiceBuilder::new()
        .layer(McpTraceLayer::new())
        .layer(
            IdGuardLayer::new()
                .restart_window(std::time::Duration::from_secs(60))
                .on_duplicate(OnDuplicate::Queue)
                .max_session_id_bytes(16),
        )
        .service(keeps.clone());
    let initialize = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;
    let first = service
        .clone()
        .oneshot(post(Some("q"), CALL))
        .await
        .unwrap();
    let queued = tokio::spawn(service.clone().oneshot(post(Some("q"), CALL)));
    tokio::task::yield_now().await;
    drop(first);
    let queued = queued.await.unwrap().unwrap();
    let _ = queued.into_body().collect().await.unwrap();
    for (session, body) in [
        (None, initialize.to_owned()),
        (Some("s"), "plain text".to_owned()),
        (
            Some("s"),
            r#"{"jsonrpc":"2.0","id":9,"result":{}}"#.to_owned(),
        ),
        (Some("s"), format!("[{CALL},{CALL}]")),
        (Some("a-session-id-over-sixteen-bytes"), CALL.to_owned()),
    ] {
        let response = service.clone().oneshot(post(session, body)).await.unwrap();
        let _ = response.into_body().collect().await.unwrap();
    }
    let guard = spans.guard_spans();
    assert!(guard.iter().all(|span| span.closed), "{guard:#?}");
    // And each span's method was recorded once.
    for span in &guard {
        assert!(span.values("mcp.method.name").len() <= 1, "{span:#?}");
        assert_eq!(span.values("otel.name").len(), 1, "{span:#?}");
    }
}

/// Control: a raw control character inside a string id does not reach the
/// decision line (no log injection): the body is refused as unreadable.
#[tokio::test]
async fn raw_control_characters_in_an_id_are_refused() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let service = ServiceBuilder::new()
        .layer(IdGuardLayer::new())
        .service(Keeps::default());
    let body = "{\"jsonrpc\":\"2.0\",\"id\":\"a\nFAKE LINE \x1b[31mred\",\"method\":\"ping\"}";
    let response = service.oneshot(post(Some("s"), body)).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::BAD_REQUEST);
    let _ = response.into_body().collect().await;
    assert!(!lines.text().contains("FAKE LINE"), "{}", lines.text());
}
