//! The recommended order (issue #44): `MetricsLayer`, tower-http's
//! `TraceLayer` making its span with `trace::request_span`, `McpTraceLayer`,
//! the guard, and a real rmcp server whose tool continues the trace with
//! `trace::parent_context`. One trace reads: the client's span, the
//! application's request span, the guard's span, the tool's span. The plain
//! `fmt` lines logged inside the guard's span show the method, the id and
//! the decision, and name the session by the tag the trace carries.
//! Ordering as in [`super::otel_tree`].

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
use crate::support::lines::Lines;
use crate::support::OK_TIMEOUT;

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
        // Each layer filtered on its own, as the README says.
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("app"))
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
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
    // `tracing` caches whether a callsite is enabled across every thread's
    // subscriber; one set by another test at this moment may have cached the
    // `DEBUG` decision events as disabled: count this one in again.
    tracing::callsite::rebuild_interest_cache();

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
    readme_samples_match(&spans, &logs);
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

/// README.md's two samples of "### Traces" are what this run produced: the
/// span's attributes (their names, and the values no run chooses), and the
/// decision line, piece by piece between its `…`, with the session's tag and
/// the server-side id's middle left to the run.
fn readme_samples_match(spans: &[SpanData], logs: &str) {
    let readme = include_str!("../../README.md");
    let block = |after: &str| {
        let start = readme
            .find(after)
            .unwrap_or_else(|| panic!("{after:?} in README.md"));
        let text = &readme[start..];
        let open = text.find("```text\n").expect("a text block") + "```text\n".len();
        let close = text[open..].find("```").expect("its end");
        text[open..open + close].to_owned()
    };

    let remapped = named(spans, "tools/call work", "")
        .into_iter()
        .find(|span| attribute(span, "mcp_id_guard.decision").as_deref() == Some("remapped"))
        .expect("a remapped span");
    let sample = block("A `tools/call` span:");
    let pairs: Vec<(&str, &str)> = sample
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .collect();
    let fixed = [
        "mcp.method.name",
        "gen_ai.operation.name",
        "mcp_id_guard.decision",
        "http.response.status_code",
    ];
    for (key, value) in &pairs {
        let recorded = attribute(remapped, key)
            .unwrap_or_else(|| panic!("the README's {key} is not on the span {remapped:#?}"));
        if fixed.contains(key) {
            assert_eq!(&recorded, value, "{key}");
        }
    }
    let ours = [
        "mcp.",
        "jsonrpc.",
        "gen_ai.",
        "mcp_id_guard.",
        "http.",
        "error.",
    ];
    for kv in &remapped.attributes {
        let key = kv.key.as_str();
        if ours.iter().any(|prefix| key.starts_with(prefix)) {
            assert!(
                pairs.iter().any(|(shown, _)| *shown == key),
                "{key} is on the span but not in the README's sample"
            );
        }
    }

    // The log line: the tag and the server-side id's middle are the run's.
    let normal = |line: &str| {
        let mut out = String::new();
        for word in line.split_inclusive([' ', '=', ':', '"']) {
            let bare = word.trim_end_matches([' ', '=', ':', '"']);
            if bare.len() == 16 && bare.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                out.push_str("<tag>");
                out.push_str(&word[bare.len()..]);
            } else {
                out.push_str(word);
            }
        }
        out
    };
    let sample = block("one line per message says what the guard decided");
    let sample = normal(sample.trim());
    let line = logs
        .lines()
        .find(|line| {
            line.contains("guard decided method=\"tools/call\"")
                && line.contains(" decision=\"remapped\"")
        })
        .expect("the remapped decision line");
    let line = normal(&line[line.find("DEBUG").expect("a level")..]);
    let mut rest = line.as_str();
    for piece in sample.split('…') {
        let at = rest
            .find(piece)
            .unwrap_or_else(|| panic!("the README's {piece:?} is not in {line:?} (in order)"));
        rest = &rest[at + piece.len()..];
    }
}
