//! The recommended order (issue #44): `MetricsLayer`, tower-http's
//! `TraceLayer` making its span with `trace::request_span`, `McpTraceLayer`,
//! the guard, and a real rmcp server whose tool continues the trace with
//! `trace::parent_context`. One trace reads: the client's span, the
//! application's request span, the guard's span, the tool's span. The plain
//! `fmt` lines logged inside the guard's span show the method, the id and
//! the decision, and name the session by the tag the trace carries.
//! Ordering as in [`super::otel_tree`].

use std::io::Write;
use std::sync::{Arc, Mutex};

use mcp_id_guard::protect::metrics::{Metrics, MetricsLayer};
use mcp_id_guard::trace::{request_span, McpTraceLayer};
use mcp_id_guard::IdGuardLayer;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tower::ServiceBuilder;
use tower_http::trace::TraceLayer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::Layer as _;

use super::otel_tree::{
    attribute, named, send, serve, spans_when, traced_mcp, CLIENT_SPAN, CLIENT_TRACE,
};
use crate::support::client::Session;
use crate::support::OK_TIMEOUT;

/// The log lines, as a `fmt` layer writes them.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("not poisoned")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

/// The spans and the log lines of a held `id: 1` call and a duplicate sent
/// while it is held, through the recommended stack.
async fn run(make_span: bool) -> anyhow::Result<(Vec<SpanData>, String)> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("app")))
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .with_filter(
                    Targets::new()
                        .with_default(tracing::Level::INFO)
                        .with_target("mcp_id_guard", tracing::Level::DEBUG),
                ),
        );
    let _default = tracing::subscriber::set_default(subscriber);

    let (mcp, mut started, gate) = traced_mcp();
    // The recommended order, with the request span `make` makes.
    macro_rules! app {
        ($make:expr) => {
            axum::Router::new().route_service(
                "/mcp",
                ServiceBuilder::new()
                    .layer(MetricsLayer::new(Metrics::new()))
                    .layer(TraceLayer::new_for_http().make_span_with($make))
                    .layer(McpTraceLayer::new())
                    .layer(IdGuardLayer::new())
                    .service(mcp),
            )
        };
    }
    let (url, task) = if make_span {
        serve(app!(request_span)).await?
    } else {
        // The control: tower-http's own span (at INFO, so that it is
        // recorded), which reads no `traceparent`.
        serve(app!(|request: &http::Request<axum::body::Body>| {
            tracing::info_span!("request", method = %request.method(), uri = %request.uri())
        }))
        .await?
    };

    let session = Session::open(&url).await?;
    let held = tokio::spawn({
        let session = session.clone();
        async move { send(&session, 1, "held", CLIENT_SPAN).await }
    });
    let first = tokio::time::timeout(OK_TIMEOUT, started.recv()).await?;
    assert_eq!(first.as_deref(), Some("held"));
    let duplicate = send(&session, 1, "duplicate", "00f067aa0ba902b8").await;
    assert!(duplicate.contains("DONE:duplicate"), "{duplicate}");
    gate.notify_one();
    let held = held.await?;
    assert!(held.contains("DONE:held"), "{held}");
    let spans = spans_when(&exporter, |spans| {
        named(spans, "tool work", "held").len() == 1
            && named(spans, "tool work", "duplicate").len() == 1
            && named(spans, "tools/call work", "").len() == 2
    })
    .await;
    task.abort();
    Ok((spans, lines.text()))
}

fn by_id(spans: &[SpanData], id: SpanId) -> Option<&SpanData> {
    spans.iter().find(|span| span.span_context.span_id() == id)
}

#[tokio::test]
async fn the_recommended_order_makes_one_trace_and_logs_that_join_it() -> anyhow::Result<()> {
    let (spans, logs) = run(true).await?;
    let trace = TraceId::from_hex(CLIENT_TRACE)?;
    let guard_spans = named(&spans, "tools/call work", "");
    assert_eq!(guard_spans.len(), 2, "{spans:#?}");
    for guard in guard_spans {
        let decision = attribute(guard, "mcp_id_guard.decision").expect("a decision");
        let (tool, client_span) = match decision.as_str() {
            "passed" => ("held", CLIENT_SPAN),
            "remapped" => ("duplicate", "00f067aa0ba902b8"),
            other => panic!("decision {other}"),
        };
        // client → the application's request span → the guard's → the tool's.
        let request = by_id(&spans, guard.parent_span_id)
            .unwrap_or_else(|| panic!("the guard's parent among {spans:#?}"));
        assert_eq!(request.name, "POST", "{request:#?}");
        assert_eq!(request.span_context.trace_id(), trace);
        assert_eq!(request.parent_span_id, SpanId::from_hex(client_span)?);
        assert_eq!(guard.span_context.trace_id(), trace);
        let tools = named(&spans, "tool work", tool);
        assert_eq!(tools.len(), 1, "{spans:#?}");
        assert_eq!(tools[0].parent_span_id, guard.span_context.span_id());
        assert_eq!(tools[0].span_context.trace_id(), trace);

        // Its log lines: the decision event inside the guard's span, with
        // the method, the id and the session's tag as the trace has it.
        let tag = attribute(guard, "mcp.session.id").expect("a session tag");
        let decided = logs
            .lines()
            .find(|line| {
                line.contains("guard decided method=\"tools/call\"")
                    && line.contains(&format!(" decision=\"{decision}\""))
            })
            .unwrap_or_else(|| panic!("a {decision} line in {logs}"));
        for shown in [
            "POST{".to_owned(),
            format!("mcp.session.id={tag}"),
            "mcp.method.name=\"tools/call\"".to_owned(),
            "jsonrpc.request.id=\"1\"".to_owned(),
            format!("mcp_id_guard.decision=\"{decision}\""),
            // The table's own tag, in the event: the same.
            format!(" session={tag}"),
        ] {
            assert!(decided.contains(&shown), "{shown} in {decided}");
        }
    }
    // The response path logs inside the span too.
    let released = logs
        .lines()
        .find(|line| line.contains("released in-flight ids"))
        .unwrap_or_else(|| panic!("a release line in {logs}"));
    assert!(
        released.contains("mcp.method.name=\"tools/call\""),
        "{released}"
    );
    // Duplicates are the normal case: no warning.
    assert!(!logs.contains(" WARN "), "{logs}");
    Ok(())
}

/// Control: with tower-http's own span (no `traceparent` read), the
/// application's request span is not in the client's trace.
#[tokio::test]
async fn a_request_span_that_ignores_traceparent_leaves_the_trace() -> anyhow::Result<()> {
    let (spans, _) = run(false).await?;
    let trace = TraceId::from_hex(CLIENT_TRACE)?;
    let requests: Vec<_> = spans.iter().filter(|span| span.name == "request").collect();
    assert!(!requests.is_empty(), "{spans:#?}");
    assert!(
        requests
            .iter()
            .all(|span| span.span_context.trace_id() != trace),
        "{requests:#?}"
    );
    Ok(())
}
