//! The guard in front of a real rmcp 3.11 server over loopback, with a real
//! HTTP client: the cross-wiring the guard exists to stop (each scenario
//! first shown on the bare server), and issue #4's protocol cases
//! (cancellation, resumed and replayed streams, the queue, replicas).

#[path = "../support/mod.rs"]
mod support;

mod full_stack;
#[cfg(feature = "otel")]
mod otel_stack;
#[cfg(feature = "otel")]
mod otel_tree;
mod protocol_rmcp;
mod real_rmcp;
mod sse_parser;
