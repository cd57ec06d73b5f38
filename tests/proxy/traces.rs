//! OpenTelemetry traces (feature `otel`): the trace layer in front of the
//! guard and the proxy, exporting to an OTLP receiver the test starts. The
//! receiver decodes what arrives with its own protobuf messages (derived
//! with prost from the field numbers of opentelemetry-proto), so a wrong
//! field number in the crate's hand-written encoder fails these tests.
//!
//! What is checked: span name, kind, attributes and parent/child links; the
//! upstream's `traceparent` naming the guard's span; a remapped duplicate's
//! span; a collector that is down, hangs or fails loses spans, not
//! requests; and, as controls, no layer (or no `OTEL_*`) leaves the
//! client's `traceparent` as it was.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use mcp_id_guard::protect::metrics::Metrics;
use mcp_id_guard::proxy::Proxy;
use mcp_id_guard::trace::legacy::{OtlpConfig, OtlpExporter, TraceLayer};
use mcp_id_guard::IdGuardLayer;
use prost::Message as _;
use tokio::sync::{mpsc, Barrier};
use tower_layer::Layer;

use crate::support::inner::respond;
use crate::support::server::{refused_port, serve_service, Served};
use crate::support::{OK_TIMEOUT, PROTOCOL_VERSION, WAIT_TIMEOUT};

/// The subset of OTLP the receiver reads, mirroring opentelemetry-proto
/// (`collector/trace/v1/trace_service.proto`, `trace/v1/trace.proto`,
/// `common/v1/common.proto`, `resource/v1/resource.proto`).
mod otlp {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, optional, tag = "1")]
        pub scope: Option<InstrumentationScope>,
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InstrumentationScope {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
        #[prost(string, tag = "3")]
        pub trace_state: String,
        #[prost(bytes = "vec", tag = "4")]
        pub parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
        #[prost(int32, tag = "6")]
        pub kind: i32,
        #[prost(fixed64, tag = "7")]
        pub start_time_unix_nano: u64,
        #[prost(fixed64, tag = "8")]
        pub end_time_unix_nano: u64,
        #[prost(message, repeated, tag = "9")]
        pub attributes: Vec<KeyValue>,
        #[prost(message, optional, tag = "15")]
        pub status: Option<Status>,
        #[prost(fixed32, tag = "16")]
        pub flags: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(string, tag = "2")]
        pub message: String,
        #[prost(int32, tag = "3")]
        pub code: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(oneof = "Value", tags = "1, 2, 3, 4")]
        pub value: Option<Value>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        Str(String),
        #[prost(bool, tag = "2")]
        Bool(bool),
        #[prost(int64, tag = "3")]
        Int(i64),
        #[prost(double, tag = "4")]
        Double(f64),
    }

    /// `SPAN_KIND_SERVER`.
    pub const SERVER: i32 = 2;
    /// `STATUS_CODE_ERROR`.
    pub const ERROR: i32 = 2;
}

/// One exported span with what the receiver read around it.
#[derive(Debug, Clone)]
struct Received {
    span: otlp::Span,
    resource: Vec<otlp::KeyValue>,
    scope: String,
    content_type: String,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<String> {
        text_of(&self.span.attributes, key)
    }

    fn int(&self, key: &str) -> Option<i64> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                otlp::Value::Int(value) => Some(*value),
                _ => None,
            })
    }
}

fn text_of(attributes: &[otlp::KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            otlp::Value::Str(text) => Some(text.clone()),
            _ => None,
        }
    })
}

/// How the test's collector answers an export.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Collector {
    /// `200`, as a collector that took the spans.
    Accepts,
    /// `500`.
    Fails,
    /// Reads the export, never answers.
    Hangs,
}

/// An OTLP/HTTP receiver on loopback: every span it decodes goes to the
/// channel (before it answers, however it answers).
async fn receiver(mode: Collector) -> anyhow::Result<(Served, mpsc::UnboundedReceiver<Received>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let tx = tx.clone();
        async move {
            let content_type = header(request.headers(), "content-type");
            let body = request
                .into_body()
                .collect()
                .await
                .map(|body| body.to_bytes())
                .unwrap_or_default();
            let decoded = otlp::ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
            for resource_spans in decoded.resource_spans {
                let resource = resource_spans.resource.unwrap_or_default().attributes;
                for scope_spans in resource_spans.scope_spans {
                    let scope = scope_spans.scope.unwrap_or_default().name;
                    for span in scope_spans.spans {
                        let _ = tx.send(Received {
                            span,
                            resource: resource.clone(),
                            scope: scope.clone(),
                            content_type: content_type.clone(),
                        });
                    }
                }
            }
            let status = match mode {
                Collector::Accepts => 200,
                Collector::Fails => 500,
                Collector::Hangs => std::future::pending().await,
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }
    });
    Ok((serve_service(service).await?, rx))
}

/// The next `count` spans the receiver decodes, within the wait bound.
async fn spans(rx: &mut mpsc::UnboundedReceiver<Received>, count: usize) -> Vec<Received> {
    let mut spans = Vec::new();
    let wait = tokio::time::timeout(WAIT_TIMEOUT, async {
        while spans.len() < count {
            match rx.recv().await {
                Some(span) => spans.push(span),
                None => break,
            }
        }
    });
    let waited = wait.await;
    assert!(waited.is_ok(), "{} of {count} spans arrived", spans.len());
    spans
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .map(|value| value.to_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// What the upstream saw of one POST.
#[derive(Debug)]
struct Seen {
    traceparent: String,
    tracestate: Option<String>,
    body: Bytes,
}

/// A JSON-RPC echo upstream that reports each POST; with `pair`, every POST
/// waits (bounded) until two are in flight, so same-id requests overlap.
async fn upstream(pair: bool) -> anyhow::Result<(Served, mpsc::UnboundedReceiver<Seen>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let barrier = Arc::new(Barrier::new(2));
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let tx = tx.clone();
        let barrier = Arc::clone(&barrier);
        async move {
            let (parts, body) = request.into_parts();
            let body = body
                .collect()
                .await
                .map(|body| body.to_bytes())
                .unwrap_or_default();
            let _ = tx.send(Seen {
                traceparent: header(&parts.headers, "traceparent"),
                tracestate: parts
                    .headers
                    .get("tracestate")
                    .map(|value| value.to_str().unwrap().to_owned()),
                body: body.clone(),
            });
            if pair {
                let _ = tokio::time::timeout(WAIT_TIMEOUT, barrier.wait()).await;
            }
            Ok::<_, Infallible>(respond(&body))
        }
    });
    Ok((serve_service(service).await?, rx))
}

/// The exporter with the test's short settings, to `endpoint`.
fn exporter(endpoint: &str, more: &[(&str, &str)]) -> OtlpExporter {
    OtlpExporter::start(config(endpoint, more))
}

/// The test's short settings, to `endpoint`.
fn config(endpoint: &str, more: &[(&str, &str)]) -> OtlpConfig {
    let endpoint = endpoint.to_owned();
    let more: Vec<(String, String)> = more
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    OtlpConfig::from_vars(|name| {
        if name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
            return Some(endpoint.clone());
        }
        let short = match name {
            "OTEL_BSP_SCHEDULE_DELAY" => Some("20"),
            "OTEL_EXPORTER_OTLP_TIMEOUT" => Some("300"),
            "OTEL_SERVICE_NAME" => Some("guard-under-test"),
            _ => None,
        };
        more.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or(short.map(str::to_owned))
    })
    .expect("valid settings")
    .expect("an endpoint")
}

/// `layer` (the trace layer, or none) in front of the guard and a proxy
/// to `upstream`, served on loopback; its `/mcp` URL.
async fn front(layer: Option<TraceLayer>, upstream: &Served) -> anyhow::Result<(Served, String)> {
    front_to(layer, &format!("http://{}", upstream.addr)).await
}

/// As [`front`], to an upstream URL.
async fn front_to(layer: Option<TraceLayer>, upstream: &str) -> anyhow::Result<(Served, String)> {
    let proxy = Proxy::builder()
        .connect_timeout(Duration::from_secs(2))
        .build(upstream)?;
    let guarded = IdGuardLayer::new().layer(proxy);
    let served = match layer {
        Some(layer) => serve_service(layer.layer(guarded)).await?,
        None => serve_service(guarded).await?,
    };
    let url = format!("http://{}/mcp", served.addr);
    Ok((served, url))
}

/// An upstream that answers every POST with an event stream: one comment,
/// then nothing, never ending.
async fn endless_stream() -> anyhow::Result<Served> {
    let service = tower::service_fn(|_: Request<Incoming>| async {
        let first = futures::stream::iter([Ok::<_, Infallible>(Frame::data(Bytes::from_static(
            b": open\n\n",
        )))]);
        let body = StreamBody::new(first.chain(futures::stream::pending()));
        Ok::<_, Infallible>(
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(body)
                .unwrap(),
        )
    });
    serve_service(service).await
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn client_traceparent() -> String {
    format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
}

/// A POST in session `s-secret-1` with the client's `traceparent`.
async fn post(url: &str, body: &str, traceparent: &str) -> anyhow::Result<(u16, String)> {
    let response = tokio::time::timeout(
        OK_TIMEOUT,
        reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", "s-secret-1")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .header("traceparent", traceparent)
            .header("tracestate", "vendor=opaque")
            .body(body.to_owned())
            .send(),
    )
    .await??;
    let status = response.status().as_u16();
    let text = tokio::time::timeout(OK_TIMEOUT, response.text()).await??;
    Ok((status, text))
}

fn tool_call(id: &str, tool: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `00-<trace>-<parent>-<flags>` split.
fn parts(traceparent: &str) -> (String, String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent:?}");
    (
        fields[1].to_owned(),
        fields[2].to_owned(),
        fields[3].to_owned(),
    )
}

/// (a) A `tools/call` with the client's `traceparent` through the binary:
/// the span continues the client's trace, carries the MCP attributes, and
/// the upstream's parent is the guard's span. The binary's long schedule
/// delay means the span can only arrive through the flush on shutdown.
#[cfg(feature = "cli")]
#[tokio::test]
async fn the_binary_exports_a_tool_call_span_and_the_upstream_is_its_child() -> anyhow::Result<()> {
    use crate::support::process::Guard;

    let (collector, mut received) = receiver(Collector::Accepts).await?;
    let (upstream, mut seen) = upstream(false).await?;
    let endpoint = format!("http://{}", collector.addr);
    let mut guard = Guard::start_env(
        &["--upstream", &format!("http://{}", upstream.addr)],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20not-logged",
            ),
            ("OTEL_SERVICE_NAME", "guard-under-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    )
    .await?;
    let (status, answer) =
        post(&guard.url(), &tool_call("7", "echo"), &client_traceparent()).await?;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(r#""id":7"#), "{answer}");
    let upstream_saw = tokio::time::timeout(WAIT_TIMEOUT, seen.recv())
        .await?
        .unwrap();

    guard.sigterm()?;
    let span = spans(&mut received, 1).await.remove(0);
    guard.wait_exit(WAIT_TIMEOUT).await?;

    assert_eq!(span.span.name, "tools/call echo");
    assert_eq!(span.span.kind, otlp::SERVER);
    assert_eq!(span.content_type, "application/x-protobuf");
    assert_eq!(span.scope, "mcp-id-guard");
    assert_eq!(
        text_of(&span.resource, "service.name").as_deref(),
        Some("guard-under-test")
    );
    assert_eq!(hex(&span.span.trace_id), CLIENT_TRACE);
    assert_eq!(hex(&span.span.parent_span_id), CLIENT_SPAN);
    assert_eq!(span.span.flags & 0xff, 1);
    assert!(span.span.end_time_unix_nano >= span.span.start_time_unix_nano);
    assert!(span.span.start_time_unix_nano > 0);
    assert_eq!(
        span.attribute("mcp.method.name").as_deref(),
        Some("tools/call")
    );
    assert_eq!(span.attribute("jsonrpc.request.id").as_deref(), Some("7"));
    assert_eq!(
        span.attribute("mcp.protocol.version").as_deref(),
        Some(PROTOCOL_VERSION)
    );
    assert_eq!(span.attribute("gen_ai.tool.name").as_deref(), Some("echo"));
    assert_eq!(
        span.attribute("gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    // The binary's restart window sends every request of a session it did
    // not see start with a server-side id.
    assert_eq!(
        span.attribute("mcp_id_guard.decision").as_deref(),
        Some("remapped")
    );
    let server_id = span.attribute("mcp_id_guard.server_request_id").unwrap();
    assert!(server_id.starts_with("mcp-id-guard:"), "{server_id}");
    assert!(
        String::from_utf8_lossy(&upstream_saw.body).contains(&server_id),
        "{upstream_saw:?}"
    );
    assert_eq!(span.int("http.response.status_code"), Some(200));
    let session = span.attribute("mcp.session.id").unwrap();
    assert_eq!(session.len(), 16, "{session}");
    assert!(session.bytes().all(|b| b.is_ascii_hexdigit()) && !session.contains("secret"));
    assert_eq!(span.span.status.clone().unwrap_or_default().code, 0);

    // The upstream is a child of the guard's span, in the client's trace.
    let (trace, parent, flags) = parts(&upstream_saw.traceparent);
    assert_eq!(trace, CLIENT_TRACE);
    assert_eq!(parent, hex(&span.span.span_id));
    assert_ne!(parent, CLIENT_SPAN);
    assert_eq!(flags, "01");
    assert_eq!(upstream_saw.tracestate.as_deref(), Some("vendor=opaque"));

    // The collector's header is never logged.
    let log = guard.log().join("\n");
    assert!(log.contains("exporting traces to"), "{log}");
    assert!(!log.contains("not-logged"), "{log}");
    Ok(())
}

/// (d) Control: the binary without `OTEL_*` leaves the client's
/// `traceparent` and `tracestate` as they came.
#[cfg(feature = "cli")]
#[tokio::test]
async fn without_otel_settings_the_binary_passes_the_clients_traceparent() -> anyhow::Result<()> {
    use crate::support::process::Guard;

    let (upstream, mut seen) = upstream(false).await?;
    let guard = Guard::start(&["--upstream", &format!("http://{}", upstream.addr)]).await?;
    let (status, _) = post(&guard.url(), &tool_call("7", "echo"), &client_traceparent()).await?;
    assert_eq!(status, 200);
    let upstream_saw = tokio::time::timeout(WAIT_TIMEOUT, seen.recv())
        .await?
        .unwrap();
    assert_eq!(upstream_saw.traceparent, client_traceparent());
    assert_eq!(upstream_saw.tracestate.as_deref(), Some("vendor=opaque"));
    assert!(guard.lines_with("exporting traces").is_empty());
    Ok(())
}

/// (b) Two same-id requests in flight in one session: one span `passed`,
/// one `remapped` carrying the id the server saw; each upstream request is
/// the child of its own span.
#[tokio::test]
async fn a_remapped_duplicate_has_its_server_side_id_on_its_span() -> anyhow::Result<()> {
    let (collector, mut received) = receiver(Collector::Accepts).await?;
    let (upstream, mut seen) = upstream(true).await?;
    let exporter = exporter(&format!("http://{}", collector.addr), &[]);
    let (_front, url) = front(Some(TraceLayer::new(&exporter)), &upstream).await?;

    let traceparent = client_traceparent();
    let call = tool_call("1", "echo");
    let (first, second) = tokio::join!(
        post(&url, &call, &traceparent),
        post(&url, &call, &traceparent),
    );
    for (status, answer) in [first?, second?] {
        assert_eq!(status, 200, "{answer}");
        assert!(answer.contains(r#""id":1"#), "{answer}");
    }
    let mut spans = spans(&mut received, 2).await;
    spans.sort_by_key(|span| span.attribute("mcp_id_guard.decision"));
    let decisions: Vec<_> = spans
        .iter()
        .map(|span| span.attribute("mcp_id_guard.decision").unwrap())
        .collect();
    assert_eq!(decisions, ["passed", "remapped"]);
    let server_id = spans[1]
        .attribute("mcp_id_guard.server_request_id")
        .expect("the remapped span names the server-side id");
    assert!(server_id.starts_with("mcp-id-guard:"), "{server_id}");
    assert_eq!(spans[0].attribute("mcp_id_guard.server_request_id"), None);
    for span in &spans {
        assert_eq!(span.attribute("jsonrpc.request.id").as_deref(), Some("1"));
        assert_eq!(hex(&span.span.parent_span_id), CLIENT_SPAN);
    }

    // Each upstream request names its own span as parent; the remapped one
    // carries the id on the span.
    for _ in 0..2 {
        let saw = tokio::time::timeout(WAIT_TIMEOUT, seen.recv())
            .await?
            .unwrap();
        let (_, parent, _) = parts(&saw.traceparent);
        let body = String::from_utf8_lossy(&saw.body);
        let span = spans
            .iter()
            .find(|span| hex(&span.span.span_id) == parent)
            .expect("the upstream's parent is one of the guard's spans");
        if body.contains("mcp-id-guard:") {
            assert_eq!(
                span.attribute("mcp_id_guard.decision").as_deref(),
                Some("remapped")
            );
            assert!(body.contains(&server_id), "{body} / {server_id}");
        }
    }
    exporter.shutdown().await;
    assert_eq!(exporter.dropped_spans(), 0);
    Ok(())
}

/// A `traceparent` that is not strictly valid starts a new trace: no
/// parent, a new trace id, the client's `tracestate` removed; the upstream
/// is still the guard span's child.
#[tokio::test]
async fn an_invalid_traceparent_starts_a_new_trace_keeping_nothing() -> anyhow::Result<()> {
    let (collector, mut received) = receiver(Collector::Accepts).await?;
    let (upstream, mut seen) = upstream(false).await?;
    let exporter = exporter(&format!("http://{}", collector.addr), &[]);
    let (_front, url) = front(Some(TraceLayer::new(&exporter)), &upstream).await?;

    let uppercase = client_traceparent().to_uppercase();
    let (status, _) = post(
        &url,
        r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#,
        &uppercase,
    )
    .await?;
    assert_eq!(status, 200);
    let span = spans(&mut received, 1).await.remove(0);
    assert_eq!(span.span.name, "ping");
    assert_eq!(span.attribute("jsonrpc.request.id").as_deref(), Some("a"));
    assert!(span.span.parent_span_id.is_empty());
    assert_ne!(hex(&span.span.trace_id), CLIENT_TRACE);
    let saw = tokio::time::timeout(WAIT_TIMEOUT, seen.recv())
        .await?
        .unwrap();
    let (trace, parent, _) = parts(&saw.traceparent);
    assert_eq!(trace, hex(&span.span.trace_id));
    assert_eq!(parent, hex(&span.span.span_id));
    assert_eq!(saw.tracestate, None);
    exporter.shutdown().await;
    Ok(())
}

/// (c) A collector that refuses connections, one that never answers and
/// one that fails: every request is still answered in time, and the spans
/// are counted dropped (the queue holds 2), none exported.
#[tokio::test]
async fn a_collector_that_is_down_loses_spans_not_requests() -> anyhow::Result<()> {
    let (upstream, _seen) = upstream(false).await?;
    let refused = refused_port();
    let (hanging, _hanging_rx) = receiver(Collector::Hangs).await?;
    let (failing, _failing_rx) = receiver(Collector::Fails).await?;
    let tiny = [
        ("OTEL_BSP_MAX_QUEUE_SIZE", "2"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1"),
    ];
    const REQUESTS: u64 = 12;
    for endpoint in [
        format!("http://127.0.0.1:{}", refused.port),
        format!("http://{}", hanging.addr),
        format!("http://{}", failing.addr),
    ] {
        let metrics = Metrics::new();
        let exporter = OtlpExporter::start(config(&endpoint, &tiny).metrics(metrics.clone()));
        let (_front, url) = front(Some(TraceLayer::new(&exporter)), &upstream).await?;
        for id in 0..REQUESTS {
            let (status, answer) = post(
                &url,
                &tool_call(&id.to_string(), "echo"),
                &client_traceparent(),
            )
            .await?;
            assert_eq!(status, 200, "{endpoint}: {answer}");
        }
        // Shutdown bounds the export in flight and the flush by the export
        // timeout (300 ms) each: a hung collector cannot hold the process.
        let stopped = tokio::time::timeout(Duration::from_secs(3), exporter.shutdown()).await;
        assert!(stopped.is_ok(), "{endpoint}: shutdown hung");
        assert_eq!(exporter.exported_spans(), 0, "{endpoint}");
        assert_eq!(exporter.dropped_spans(), REQUESTS, "{endpoint}");
        let mut scrape = String::new();
        metrics.encode(None, &mut scrape);
        assert!(
            scrape.contains(&format!(
                "mcp_id_guard_trace_spans_dropped_total {REQUESTS}\n"
            )),
            "{scrape}"
        );
        assert!(scrape.contains("mcp_id_guard_trace_spans_exported_total 0\n"));
    }
    Ok(())
}

/// (d) Control: the guard and proxy without the trace layer, and with the
/// disabled one, leave the client's `traceparent` and `tracestate` as they
/// came; an exporter nobody feeds exports nothing.
#[tokio::test]
async fn without_the_layer_the_clients_traceparent_reaches_the_upstream() -> anyhow::Result<()> {
    let (collector, mut received) = receiver(Collector::Accepts).await?;
    let (upstream, mut seen) = upstream(false).await?;
    let exporter = exporter(&format!("http://{}", collector.addr), &[]);
    for layer in [None, Some(TraceLayer::disabled())] {
        let (_front, url) = front(layer, &upstream).await?;
        let (status, _) = post(&url, &tool_call("1", "echo"), &client_traceparent()).await?;
        assert_eq!(status, 200);
        let saw = tokio::time::timeout(WAIT_TIMEOUT, seen.recv())
            .await?
            .unwrap();
        assert_eq!(saw.traceparent, client_traceparent());
        assert_eq!(saw.tracestate.as_deref(), Some("vendor=opaque"));
    }
    // After the flush, whatever would have arrived has.
    exporter.shutdown().await;
    assert_eq!(exporter.exported_spans(), 0);
    assert!(received.try_recv().is_err());
    Ok(())
}

/// Status `ERROR`: an upstream that is down (the proxy's `502`) and an
/// event stream the client leaves before its end (`response_incomplete`,
/// the span ending when the body is dropped).
#[tokio::test]
async fn failed_exchanges_end_their_spans_in_error() -> anyhow::Result<()> {
    let (collector, mut received) = receiver(Collector::Accepts).await?;
    let exporter = exporter(&format!("http://{}", collector.addr), &[]);

    let refused = refused_port();
    let down = format!("http://127.0.0.1:{}", refused.port);
    let (_front, url) = front_to(Some(TraceLayer::new(&exporter)), &down).await?;
    let (status, _) = post(&url, &tool_call("1", "echo"), &client_traceparent()).await?;
    assert_eq!(status, 502);
    let span = spans(&mut received, 1).await.remove(0);
    assert_eq!(
        span.span.status.clone().unwrap_or_default().code,
        otlp::ERROR
    );
    assert_eq!(span.attribute("error.type").as_deref(), Some("502"));
    assert_eq!(span.int("http.response.status_code"), Some(502));

    let endless = endless_stream().await?;
    let (_front, url) = front(Some(TraceLayer::new(&exporter)), &endless).await?;
    let mut response = tokio::time::timeout(
        OK_TIMEOUT,
        reqwest::Client::new()
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", "s-secret-1")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .body(tool_call("2", "slow"))
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    let first = tokio::time::timeout(OK_TIMEOUT, response.chunk()).await??;
    assert!(first.is_some());
    drop(response);
    let span = spans(&mut received, 1).await.remove(0);
    assert_eq!(span.span.name, "tools/call slow");
    assert_eq!(
        span.span.status.clone().unwrap_or_default().code,
        otlp::ERROR
    );
    assert_eq!(
        span.attribute("error.type").as_deref(),
        Some("response_incomplete")
    );
    // No client traceparent: a trace of its own.
    assert!(span.span.parent_span_id.is_empty());
    exporter.shutdown().await;
    Ok(())
}

/// What a hostile client writes stays bounded and never shapes a span
/// name: an id of 10 000 characters is cut to 256 bytes, a tool name MCP
/// does not allow is left out (the span is named after the method alone),
/// an oversized `MCP-Protocol-Version` is left out, and two `traceparent`
/// headers start a new trace. A batch gets one span per message, siblings
/// under the client's span; the upstream's parent is the first one's.
#[tokio::test]
async fn hostile_input_stays_bounded_and_a_batch_gets_a_span_per_message() -> anyhow::Result<()> {
    let (collector, mut received) = receiver(Collector::Accepts).await?;
    let (upstream, mut seen) = upstream(false).await?;
    let exporter = exporter(&format!("http://{}", collector.addr), &[]);
    let (_front, url) = front(Some(TraceLayer::new(&exporter)), &upstream).await?;
    let client = reqwest::Client::new();
    let hostile_post = |body: String| {
        client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", "s-secret-1")
            .header("mcp-protocol-version", "9".repeat(1000))
            .header("traceparent", client_traceparent())
            .header("traceparent", client_traceparent())
            .body(body)
            .send()
    };
    let long_id = format!("\"{}\"", "x".repeat(10_000));
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{long_id},"method":"tools/call","params":{{"name":"evil name\n","arguments":{{}}}}}}"#
    );
    let response = tokio::time::timeout(OK_TIMEOUT, hostile_post(body)).await??;
    assert_eq!(response.status(), 200);
    let span = spans(&mut received, 1).await.remove(0);
    assert_eq!(span.span.name, "tools/call");
    assert_eq!(span.attribute("gen_ai.tool.name"), None);
    assert_eq!(span.attribute("mcp.protocol.version"), None);
    let id = span.attribute("jsonrpc.request.id").unwrap();
    assert!(id.len() <= 256 && id.starts_with("\"xxx"), "{}", id.len());
    assert!(span.span.parent_span_id.is_empty());
    assert_ne!(hex(&span.span.trace_id), CLIENT_TRACE);
    let _ = tokio::time::timeout(WAIT_TIMEOUT, seen.recv()).await?;

    let batch = format!(
        r#"[{{"jsonrpc":"2.0","id":1,"method":"ping"}},{},{{"jsonrpc":"2.0","method":"notifications/progress","params":{{}}}}]"#,
        tool_call("2", "echo")
    );
    let (status, _) = post(&url, &batch, &client_traceparent()).await?;
    assert_eq!(status, 200);
    let spans = spans(&mut received, 3).await;
    let names: Vec<&str> = spans.iter().map(|span| span.span.name.as_str()).collect();
    assert_eq!(names, ["ping", "tools/call echo", "notifications/progress"]);
    for span in &spans {
        assert_eq!(hex(&span.span.trace_id), CLIENT_TRACE);
        assert_eq!(hex(&span.span.parent_span_id), CLIENT_SPAN);
    }
    assert_eq!(spans[2].attribute("jsonrpc.request.id"), None);
    let saw = tokio::time::timeout(WAIT_TIMEOUT, seen.recv())
        .await?
        .unwrap();
    let (_, parent, _) = parts(&saw.traceparent);
    assert_eq!(parent, hex(&spans[0].span.span_id));
    exporter.shutdown().await;
    Ok(())
}
