//! Traces through `tracing` (feature `otel`, issue #31): an axum app whose
//! subscriber has tracing-opentelemetry and an in-memory span exporter,
//! `McpTraceLayer` outside the guard, and a real rmcp server whose tool
//! opens its own `tracing` span, parented by the `traceparent` it received.
//! One trace holds the client's parent, the guard's span and the tool's
//! span as its child; a remapped duplicate's span carries its server-side
//! id. Ordering: the tool reports each start on a channel and waits on a
//! gate; the spans, which end as the response bodies are dropped, are
//! awaited within a bound.

use std::sync::Arc;
use std::time::Duration;

use mcp_id_guard::trace::McpTraceLayer;
use mcp_id_guard::IdGuardLayer;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use serde_json::json;
use tokio::sync::{mpsc, Notify};
use tower::ServiceBuilder;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::support::client::Session;
use crate::support::{OK_TIMEOUT, WAIT_TIMEOUT};

/// The client's span: the parent the guard must continue.
pub(crate) const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
pub(crate) const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct WorkArgs {
    /// Names the call; `held` waits for the test's gate.
    sentinel: String,
}

/// A tool that opens its own span under the `traceparent` it received, as
/// an instrumented handler does.
#[derive(Clone)]
pub(crate) struct Traced {
    tool_router: ToolRouter<Self>,
    started: mpsc::UnboundedSender<String>,
    gate: Arc<Notify>,
}

#[tool_router]
impl Traced {
    #[tool(description = "Answers DONE:<sentinel> inside its own span")]
    async fn work(
        &self,
        Parameters(args): Parameters<WorkArgs>,
        Extension(parts): Extension<http::request::Parts>,
    ) -> String {
        // The one line the docs give a tool (`trace::parent_context`).
        let span = tracing::info_span!("tool work", sentinel = %args.sentinel);
        let _ = span.set_parent(mcp_id_guard::trace::parent_context(&parts));
        // Instrumented, not entered across the wait: an entered span would
        // stay current for whatever else this thread runs meanwhile.
        async {
            let _ = self.started.send(args.sentinel.clone());
            if args.sentinel == "held" {
                self.gate.notified().await;
            }
            format!("DONE:{}", args.sentinel)
        }
        .instrument(span)
        .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Traced {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("traced", "0.0.0"))
    }
}

struct App {
    url: String,
    started: mpsc::UnboundedReceiver<String>,
    gate: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The traced rmcp service, with the channel its tool reports starts on and
/// the gate a `held` call waits for.
pub(crate) fn traced_mcp() -> (
    StreamableHttpService<Traced, LocalSessionManager>,
    mpsc::UnboundedReceiver<String>,
    Arc<Notify>,
) {
    let (started_tx, started) = mpsc::unbounded_channel();
    let gate = Arc::new(Notify::new());
    let handler = Traced {
        tool_router: Traced::tool_router(),
        started: started_tx,
        gate: Arc::clone(&gate),
    };
    let mcp = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    (mcp, started, gate)
}

/// The axum app: `McpTraceLayer` (or none), the guard, rmcp.
async fn app(traced: bool) -> anyhow::Result<App> {
    let (mcp, started, gate) = traced_mcp();
    let trace = if traced {
        McpTraceLayer::new()
    } else {
        McpTraceLayer::disabled()
    };
    let stack = ServiceBuilder::new()
        .layer(trace)
        .layer(IdGuardLayer::new())
        .service(mcp);
    let router = axum::Router::new().route_service("/mcp", stack);
    let (url, task) = serve(router).await?;
    Ok(App {
        url,
        started,
        gate,
        task,
    })
}

/// Serves `router` on a loopback port: its `/mcp` URL and the server task.
pub(crate) async fn serve(
    router: axum::Router,
) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((url, task))
}

fn call(id: u64, sentinel: &str) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "work", "arguments": {"sentinel": sentinel}}})
}

/// Sends a `tools/call` under the client's span; the whole answer.
pub(crate) async fn send(session: &Session, id: u64, sentinel: &str, client_span: &str) -> String {
    let request = session
        .post_json(call(id, sentinel))
        .header("traceparent", format!("00-{CLIENT_TRACE}-{client_span}-01"));
    let answer = async { request.send().await?.text().await };
    tokio::time::timeout(OK_TIMEOUT, answer)
        .await
        .expect("answered in time")
        .expect("an answer")
}

pub(crate) fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| match &kv.value {
            Value::String(text) => text.to_string(),
            other => other.to_string(),
        })
}

/// The finished spans once `done` holds of them (spans end as the server
/// drops the response bodies, just after the client read them).
pub(crate) async fn spans_when(
    exporter: &InMemorySpanExporter,
    done: impl Fn(&[SpanData]) -> bool,
) -> Vec<SpanData> {
    let deadline = tokio::time::Instant::now() + WAIT_TIMEOUT;
    loop {
        let spans = exporter.get_finished_spans().expect("in memory");
        if done(&spans) || tokio::time::Instant::now() > deadline {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) fn named<'a>(spans: &'a [SpanData], name: &str, sentinel: &str) -> Vec<&'a SpanData> {
    spans
        .iter()
        .filter(|span| span.name == name)
        .filter(|span| {
            name != "tool work" || attribute(span, "sentinel").as_deref() == Some(sentinel)
        })
        .collect()
}

/// One trace: client's span → the guard's `tools/call work` span → the
/// tool's span; and a duplicate of id 1 sent while the first is held in
/// the tool is remapped, its span carrying the id the server saw, its tool
/// span its child.
async fn one_tree(traced: bool) -> anyhow::Result<Vec<SpanData>> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("app")));
    // This test's thread only (a current-thread runtime: rmcp's tasks run
    // here too).
    let _default = tracing::subscriber::set_default(subscriber);

    let mut app = app(traced).await?;
    let session = Session::open(&app.url).await?;
    let held = tokio::spawn({
        let session = session.clone();
        async move { send(&session, 1, "held", CLIENT_SPAN).await }
    });
    let first = tokio::time::timeout(OK_TIMEOUT, app.started.recv()).await?;
    assert_eq!(first.as_deref(), Some("held"));
    let duplicate = send(&session, 1, "duplicate", "00f067aa0ba902b8").await;
    assert!(duplicate.contains("DONE:duplicate"), "{duplicate}");
    app.gate.notify_one();
    let held = held.await?;
    assert!(held.contains("DONE:held"), "{held}");

    let spans = spans_when(&exporter, |spans| {
        named(spans, "tool work", "held").len() == 1
            && named(spans, "tool work", "duplicate").len() == 1
            && (!traced || named(spans, "tools/call work", "").len() == 2)
    })
    .await;
    Ok(spans)
}

#[tokio::test]
async fn the_client_the_guard_and_the_tool_make_one_tree() -> anyhow::Result<()> {
    let spans = one_tree(true).await?;
    let trace = TraceId::from_hex(CLIENT_TRACE)?;
    let guard_spans = named(&spans, "tools/call work", "");
    assert_eq!(guard_spans.len(), 2, "{spans:#?}");
    let by_decision = |decision: &str| {
        *guard_spans
            .iter()
            .find(|span| attribute(span, "mcp_id_guard.decision").as_deref() == Some(decision))
            .unwrap_or_else(|| panic!("a {decision} span in {guard_spans:#?}"))
    };
    let passed = by_decision("passed");
    let remapped = by_decision("remapped");
    for (guard, tool, client_span) in [
        (passed, "held", CLIENT_SPAN),
        (remapped, "duplicate", "00f067aa0ba902b8"),
    ] {
        // The guard's span: the client's child, in the client's trace.
        assert_eq!(guard.span_context.trace_id(), trace);
        assert_eq!(guard.parent_span_id, SpanId::from_hex(client_span)?);
        assert_eq!(guard.span_kind, opentelemetry::trace::SpanKind::Server);
        assert_eq!(
            attribute(guard, "mcp.method.name").as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            attribute(guard, "gen_ai.tool.name").as_deref(),
            Some("work")
        );
        assert_eq!(attribute(guard, "jsonrpc.request.id").as_deref(), Some("1"));
        assert_eq!(
            attribute(guard, "mcp.session.id").map(|tag| tag.len()),
            Some(16)
        );
        // The tool's span: the guard's child, in the same trace.
        let tools = named(&spans, "tool work", tool);
        assert_eq!(tools.len(), 1, "{spans:#?}");
        assert_eq!(tools[0].span_context.trace_id(), trace);
        assert_eq!(tools[0].parent_span_id, guard.span_context.span_id());
    }
    assert_eq!(attribute(passed, "mcp_id_guard.server_request_id"), None);
    let server_id = attribute(remapped, "mcp_id_guard.server_request_id").expect("server id");
    assert_ne!(server_id, "1");
    // Session ids are secrets: only their tag is recorded.
    let everything = format!("{spans:?}");
    assert!(!everything.contains("mcp-session-id"));
    Ok(())
}

/// Control: without the layer there is no guard span, and the tool's span
/// hangs straight under the client's.
#[tokio::test]
async fn without_the_layer_the_tool_hangs_under_the_client() -> anyhow::Result<()> {
    let spans = one_tree(false).await?;
    assert!(named(&spans, "tools/call work", "").is_empty());
    let tools = named(&spans, "tool work", "held");
    assert_eq!(tools.len(), 1, "{spans:#?}");
    assert_eq!(tools[0].parent_span_id, SpanId::from_hex(CLIENT_SPAN)?);
    Ok(())
}
