//! The hand-written OTLP/HTTP exporter and its trace layer, kept for the
//! `mcp-id-guard` binary until it exports through `opentelemetry-otlp`
//! (issue #31, step 2). Not public API: hidden, and removed with that step.

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
