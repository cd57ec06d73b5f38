//! OpenTelemetry traces of MCP exchanges (feature `otel`), through
//! `tracing`: [`McpTraceLayer`] records one `tracing` span per JSON-RPC
//! message of each POST, and the application's subscriber decides where
//! it goes. With [`tracing-opentelemetry`](https://docs.rs/tracing-opentelemetry)
//! in that subscriber, the guard's spans are children of the client's span
//! and parents of the handler's, in one trace, exported by whatever
//! exporter the application already has: the layer has none of its own.
//!
//! # Where it goes
//! Outside [`IdGuardLayer`](crate::IdGuardLayer), whose account of each
//! POST it reads, and inside tower-http's `TraceLayer` when the application
//! has one, made with [`request_span`] so that the application's request
//! span continues the client's trace too. The recommended order, outermost
//! first: [`MetricsLayer`](crate::protect::metrics::MetricsLayer) (it counts
//! what every layer answers), `TraceLayer::new_for_http().make_span_with(request_span)`,
//! `McpTraceLayer`, the application's other layers, `IdGuardLayer`. One
//! trace then reads: the client's span, the request span, the guard's span,
//! the handler's span ([`parent_context`]).
//!
//! # Spans
//! Each request
//! and notification of a POST (each member of a batch) gets a span (target
//! `mcp_id_guard::trace`, level `INFO`) of kind `SERVER`, with fields in
//! the form tracing-opentelemetry maps to OpenTelemetry (`otel.name`,
//! `otel.kind`, `otel.status_code`; the others become attributes as
//! named), following the OpenTelemetry semantic conventions for MCP:
//!
//! - name `{mcp.method.name} {target}`, the target being the tool of a
//!   `tools/call` or the prompt of a `prompts/get`, else just the method;
//! - `mcp.method.name` (the MCP methods by name, any other `other`, as in
//!   the metrics), `jsonrpc.request.id` (a request's id as text, cut at 256
//!   bytes), `mcp.protocol.version` (the `MCP-Protocol-Version` header, when
//!   a short printable token), `mcp.session.id` (16 hex digits of a keyed
//!   hash of the session id, never the id itself; the key is random per
//!   process, so a session's tag differs across restarts and replicas, and
//!   a guessed session id cannot be confirmed against the trace store; the
//!   crate's log lines name the session by the same tag),
//!   `gen_ai.tool.name` and `gen_ai.operation.name = execute_tool` for a
//!   `tools/call`, `gen_ai.prompt.name` for a `prompts/get`,
//!   `http.response.status_code`;
//! - `mcp_id_guard.decision`: what the guard did (`passed`, `remapped`,
//!   `rejected`, `queued`, `refused`, `cancelled`, the words of the
//!   metrics), and `mcp_id_guard.server_request_id`: the id a remapped
//!   request reached the server with;
//! - `otel.status_code = ERROR` with `error.type` when the guard refused
//!   the message (`rejected`, `refused`), the response was a server error
//!   (its status code, `502`), or the response did not go out whole
//!   (`response_incomplete`: the service failed, the body failed, the
//!   client went away first).
//!
//! The session's tag and the revision are recorded as the span opens; the
//! first message's method, ids, names and decision as soon as the guard has
//! decided on the read body, so that what is logged inside the span while
//! the server works shows them in plain `fmt` logs too. The guard logs its
//! decision inside the span (target `mcp_id_guard::decision`, `DEBUG`), and
//! what it logs as the response passes (ids restored, released) too. Every
//! log line of the crate that names a session uses the tag the span
//! records.
//!
//! A span opens when the request arrives and closes when its response body
//! ends or is dropped: a queued duplicate's wait counts, and an answer
//! streamed as server-sent events is covered until the stream ends. The
//! inner service is polled inside the span, so what it records in the same
//! task is the span's child. A POST the guard does not read (no session
//! yet, as an `initialize`; revision 2026-07-28) gets one span, under the
//! method its `Mcp-Method` header names, else `initialize` when its answer
//! starts a session, else `other`, with no request id.
//! A POST with no message that has a method (only client responses), or
//! whose response carries no `Exchange` (no guard inside), gets one span
//! named `POST`. In a batch the first message's span opens with the
//! request; the others open as the response arrives, as its siblings, 16
//! spans at most: a batch is the client's to size, and the first span
//! counts the messages left without one (`mcp_id_guard.batch.undescribed`).
//! A span the guard described when it decided keeps that description
//! whatever ends the exchange (the client gone, a layer between answering
//! in the server's place).
//! `GET` and `DELETE` get none and pass untouched.
//!
//! # Propagation
//! Through OpenTelemetry's own W3C propagator
//! ([`TraceContextPropagator`](opentelemetry_sdk::propagation::TraceContextPropagator)).
//! One valid `traceparent` continues the client's trace (the guard's spans
//! are children of the client's span, or of [`request_span`]'s when the
//! request arrived in it); several, or an invalid one, start a
//! new trace under the application's current span and keep nothing of what
//! came (its `tracestate` is removed too). Either way the request goes on
//! with a `traceparent` naming the guard's span as the parent, so the
//! server's spans hang below the guard's; the client's `tracestate` goes on
//! with it. In a batch the upstream's parent is the first message's span
//! (one HTTP request carries one `traceparent`). Sampling is the
//! subscriber's (the `Sampler` of the application's tracer provider); an
//! unsampled request still sends a `traceparent`, with the flag off.
//! Without tracing-opentelemetry in the subscriber, a request's valid
//! `traceparent` goes on untouched.
//!
//! ```
//! use mcp_id_guard::trace::McpTraceLayer;
//! use mcp_id_guard::IdGuardLayer;
//! use opentelemetry::trace::TracerProvider as _;
//! use opentelemetry_sdk::trace::SdkTracerProvider;
//! use tower::ServiceBuilder;
//! use tracing_subscriber::layer::SubscriberExt as _;
//!
//! // The application's own pipeline: a tracer provider with its exporter
//! // (here none), and tracing-opentelemetry in its subscriber.
//! let provider = SdkTracerProvider::builder().build();
//! let subscriber = tracing_subscriber::registry()
//!     .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("app")));
//! let _default = tracing::subscriber::set_default(subscriber);
//!
//! let inner = tower::service_fn(|_: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//! });
//! let service = ServiceBuilder::new()
//!     .layer(McpTraceLayer::new())
//!     .layer(IdGuardLayer::new())
//!     .service(inner);
//! # let _ = service;
//! ```

mod body;
mod future;
mod layer;
mod propagation;
mod request;
mod service;
mod span;

/// The `opentelemetry` crate (0.33) whose context the guard continues: an
/// application on another version compiles, but its context is not the
/// guard's, and each guard span starts a trace of its own.
pub use opentelemetry;
/// The `tracing-opentelemetry` crate (0.34) whose layer must be in the
/// subscriber for the guard's spans to reach OpenTelemetry: build the layer
/// from here and it is always the matching version.
pub use tracing_opentelemetry;

pub use body::TracedBody;
pub use future::TraceFuture;
pub use layer::McpTraceLayer;
pub use propagation::parent_context;
pub use request::request_span;
pub use service::McpTrace;
