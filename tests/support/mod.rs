//! The one harness of the integration tests, compiled into each test binary
//! with `#[path = "../support/mod.rs"] mod support;`.
//!
//! - [`server`]: an rmcp 3.11 echo server on loopback (bare, behind one or
//!   more guards, or as the proxy's upstream), and serving any tower service
//!   over hyper as the binary does.
//! - [`client`]: an MCP streamable-HTTP client over reqwest that reports what
//!   each call got back.
//! - [`sse`]: the one SSE parser of the tests.
//! - [`ids`]: reading JSON-RPC ids and responses.
//! - [`inner`]: an in-process JSON-RPC echo for the guard to wrap.
//! - [`wait`]: bounding waits and checking the guard let go of everything.
//! - [`lines`]: what a log subscriber wrote, and requests to log about.
//!
//! Ordering between a test and the server never relies on sleeps: the echo
//! tool records when a call started, was cancelled and finished, held calls
//! park on a gate the test opens, and every wait is bounded.

// Each test binary uses a different subset of the harness; unused-item
// warnings would only be noise.
#![allow(dead_code)]

pub mod client;
pub mod ids;
pub mod inner;
pub mod lines;
#[cfg(feature = "cli")]
pub mod process;
#[cfg(feature = "proxy")]
pub mod proxy;
pub mod server;
pub mod sse;
pub mod wait;

use std::time::Duration;

/// The protocol revision the client negotiates: a legacy-session revision,
/// so the guard tracks the session's requests.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// The `Accept` header every MCP POST carries (rmcp answers 406 otherwise).
pub const ACCEPT: &str = "application/json, text/event-stream";
/// How long a call may go without its response before it counts as hung.
/// rmcp's SSE keep-alive (15 s) would defeat a read timeout; this bound is a
/// wall-clock deadline over the whole exchange.
pub const HANG_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound for exchanges that are expected to succeed: generous, so a loaded
/// machine does not turn a slow answer into a false "hung".
pub const OK_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound for the test's own waits on the server (log entries, counters).
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(10);
