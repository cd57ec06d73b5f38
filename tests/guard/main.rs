//! The guard in process: as a plain `tower::Service`, on an `axum::Router`
//! and in `ServiceBuilder` stacks, against bad and hostile input, the release
//! property, and the fuzz targets' invariants. One test binary, so rmcp, axum
//! and reqwest are linked once for all of them.

#[path = "../support/mod.rs"]
mod support;

mod answered;
mod axum_composition;
mod bad_input;
mod bodies;
mod bound_ids;
#[cfg(feature = "internals")]
mod fuzz_regressions;
mod hostile_input;
mod logs;
// Requests by MCP method and the guard's decision, scraped.
mod metrics_labels;
mod model;
mod release_property;
// The scenario table every face must answer alike.
mod scenarios;
mod tower_service;
