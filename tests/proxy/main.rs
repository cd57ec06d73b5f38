//! The `proxy` feature: the guarded reverse proxy in front of a real rmcp
//! 3.11 server and small hand-made upstreams, over loopback (HTTP/1.1 and
//! h2c), and the `mcp-id-guard` binary. Built only with the `proxy` feature
//! (`[[test]] required-features`). New proxy test files go here as modules.

#[path = "../support/mod.rs"]
mod support;

// The admin listener of the binary under the main listener's limits.
#[cfg(feature = "cli")]
mod admin;
// The library server's connection cap: idle connections make room.
#[cfg(feature = "server")]
mod capacity;
// The binary is only built with the `cli` feature.
#[cfg(feature = "cli")]
mod binary;
// The binary running its upstream as a child process (`-- COMMAND`).
#[cfg(all(feature = "cli", unix))]
mod child;
// Request bodies under the binary's memory budget and size cap.
#[cfg(feature = "cli")]
mod bodies;
mod failures;
// Tests of the binary itself.
#[cfg(feature = "cli")]
mod hardening;
mod headers;
// TRACE, CONNECT and OPTIONS * answered by the proxy itself.
mod methods;
// The protection layers composed with the guard and the proxy in an axum app.
mod layers;
#[cfg(feature = "cli")]
mod metrics_series;
// `mcp-id-guard probe` against bare and guarded servers.
#[cfg(feature = "cli")]
mod probe;
// `mcp-id-guard probe` against hostile and unusual servers.
#[cfg(feature = "cli")]
mod probe_hostile;
// The public-deployment recipe: HAProxy terminating TLS in front of the
// binary running its server.
#[cfg(all(feature = "cli", unix))]
mod public;
// The reference HAProxy deployment: two binaries behind a real balancer.
#[cfg(feature = "cli")]
mod replicas;
// Per-connection request cap and HTTP/2 reset budget of the binary.
#[cfg(feature = "cli")]
mod resets;
mod rmcp;
// The body budget under slow bodies announcing the size cap.
#[cfg(feature = "cli")]
mod slow_bodies;
mod streaming;
// OpenTelemetry traces exported to an OTLP receiver the tests start.
#[cfg(feature = "otel")]
mod traces;
