//! OpenTelemetry traces of MCP exchanges (feature `otel`): [`TraceLayer`]
//! records one span per JSON-RPC message of each POST, and [`OtlpExporter`]
//! sends them to an OTLP collector over HTTP.
//!
//! # Spans
//! Put the layer outside [`IdGuardLayer`](crate::IdGuardLayer): it reads
//! the guard's [`Exchange`](crate::exchange::Exchange) on each response. Each request
//! and notification of a POST (each member of a batch) gets a span of kind
//! `SERVER`, following the OpenTelemetry semantic conventions for MCP:
//!
//! - name `{mcp.method.name} {target}`, the target being the tool of a
//!   `tools/call` or the prompt of a `prompts/get`, else just the method;
//! - `mcp.method.name` (the MCP methods by name, any other `other`, as in
//!   the metrics), `jsonrpc.request.id` (a request's id as text, cut at 256
//!   bytes), `mcp.protocol.version` (the `MCP-Protocol-Version` header),
//!   `mcp.session.id` (16 hex digits of a keyed hash of the session id,
//!   never the id itself; the key is random per process, so a session's tag
//!   differs across restarts and replicas, and a guessed session id cannot
//!   be confirmed against the trace store), `gen_ai.tool.name` and
//!   `gen_ai.operation.name = execute_tool` for a `tools/call`,
//!   `gen_ai.prompt.name` for a `prompts/get`, `http.response.status_code`;
//! - `mcp_id_guard.decision`: what the guard did (`passed`, `remapped`,
//!   `rejected`, `queued`, `refused`, `cancelled`, the words of the
//!   metrics), and `mcp_id_guard.server_request_id`: the id a remapped
//!   request reached the server with;
//! - status `ERROR` with `error.type` when the guard refused the message
//!   (`rejected`, `refused`), the response was a server error (its status
//!   code, `502`), or the response did not go out whole
//!   (`response_incomplete`: the service failed, the body failed, the
//!   client went away first).
//!
//! A span starts when the request arrives and ends when its response body
//! ends or is dropped: a queued duplicate's wait counts, and an answer
//! streamed as server-sent events is covered until the stream ends (a
//! server that keeps a POST's stream open after its answer keeps the span
//! open; a client that then leaves makes it `response_incomplete`). A POST
//! the guard does not read (no session yet, as an `initialize`; revision
//! 2026-07-28) gets one span, under the method its `Mcp-Method` header
//! names, else `other`, with no request id. A POST
//! with no message that has a method (only client responses), or whose
//! response carries no `Exchange` (no guard inside), gets one span named
//! `POST`. `GET` and `DELETE` get none and pass untouched.
//!
//! # Propagation
//! A valid W3C `traceparent` (version `00`, lowercase hex, ids not all
//! zeros, one header) continues the client's trace: the spans are children
//! of the client's span, in its trace. Anything else starts a new trace and
//! keeps nothing of what came (its `tracestate` is removed too). Either way
//! the request goes on with a `traceparent` naming the guard's span as the
//! parent, so the server's spans hang below the guard's; `tracestate` goes
//! on as the client sent it. In a batch the upstream's parent is the first
//! message's span (one HTTP request carries one `traceparent`); the others
//! are its siblings under the client's span.
//!
//! Sampling follows `OTEL_TRACES_SAMPLER` (default `parentbased_always_on`:
//! the client's sampled flag, else every trace). An unsampled request is
//! not recorded, but its upstream still gets a `traceparent` with the flag
//! off. Trace and span ids are SipHash-1-3 of a counter under a random
//! per-process key (no random-number dependency).
//!
//! # Export
//! The exporter is this crate's own: OTLP/HTTP with protobuf encoding
//! (`http/protobuf`, the OTLP default), written by hand for the few
//! messages it sends, over the hyper client already in the tree. Not the
//! `opentelemetry` crates: they add a large build (the CI runs on two cores
//! at its time budget) and do not bound every wait and buffer the way this
//! crate must. Only plain `http://` endpoints: point it at a local
//! collector, which may forward over TLS or gRPC. [`OtlpConfig`] reads the
//! standard `OTEL_*` variables.
//!
//! Finished spans go into a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`); a
//! request never waits for it: when it is full the span is dropped and
//! counted ([`OtlpExporter::dropped_spans`]; with
//! [`OtlpConfig::metrics`], also in `mcp_id_guard_trace_spans_dropped_total`
//! and `…_exported_total` of a [`Metrics`](crate::protect::metrics::Metrics)). A background task posts them
//! in batches (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, every
//! `OTEL_BSP_SCHEDULE_DELAY`), one export at a time, each bounded by the
//! export timeout; a batch that fails is dropped (logged at most once per
//! 10 s, never with header values). A collector that is down loses spans,
//! not requests. [`OtlpExporter::shutdown`] exports what is left, within
//! two export timeouts (the export in flight, then the flush).
//!
//! ```
//! use mcp_id_guard::trace::{OtlpConfig, OtlpExporter, TraceLayer};
//! use mcp_id_guard::IdGuardLayer;
//! use tower::ServiceBuilder;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // In a program: `OtlpConfig::from_env()`.
//! let config = OtlpConfig::from_vars(|name| match name {
//!     "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
//!     _ => None,
//! })
//! .expect("valid settings")
//! .expect("an endpoint is set");
//! assert_eq!(config.endpoint(), "http://127.0.0.1:4318/v1/traces");
//!
//! let exporter = OtlpExporter::start(config);
//! let inner = tower::service_fn(|_: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//! });
//! let service = ServiceBuilder::new()
//!     .layer(TraceLayer::new(&exporter))
//!     .layer(IdGuardLayer::new())
//!     .service(inner);
//! # let _ = service;
//!
//! // On the way out:
//! exporter.shutdown().await;
//! assert_eq!(exporter.dropped_spans(), 0);
//! # }
//! ```

mod body;
mod config;
mod context;
mod export;
mod future;
mod layer;
mod otlp;
mod record;
mod service;
mod span;
mod tracer;

pub use body::TracedBody;
pub use config::{ConfigError, OtlpConfig, Sampler};
pub use export::OtlpExporter;
pub use future::TraceFuture;
pub use layer::TraceLayer;
pub use service::TraceService;
