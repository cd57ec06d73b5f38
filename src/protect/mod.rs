//! Protections for an MCP server facing the network, each a tower layer that
//! composes with [`IdGuardLayer`](crate::IdGuardLayer) through
//! `ServiceBuilder` or axum's `.layer()`, in front of an rmcp service, an axum
//! router or the [`proxy`](crate::proxy). For the common case,
//! [`ProtectLayer`] applies the three request protections in the recommended
//! order with one response body type; each is also a layer of its own, in
//! its module, for a stack composed by hand:
//!
//! | layer | refuses | status |
//! |---|---|---|
//! | [`head::HeadLimitLayer`] | a request head over its limit | 431 |
//! | [`host::HostLayer`] | a `Host` or `Origin` its [`HostPolicy`](host::HostPolicy) does not serve (DNS rebinding) | 421 / 403 |
//! | [`pace::BodyPaceLayer`] | a request body that pauses too long or arrives too slowly | 408 |
//! | [`buffer::BodyBufferLayer`] | a request body over the size cap, or over what the memory budgets have left | 413 / 503 |
//! | [`ProtectLayer`] | head, host and pace, in this order | |
//!
//! Each layer answers what it refuses itself, with a precise HTTP status and
//! a JSON-RPC error, and marks that response with a [`Refused`] extension so
//! that a layer outside it ([`metrics`]) can count refusals by kind. Their
//! responses share one body type, [`ProtectedBody`], which keeps the inner
//! body's error type. Put them outside the guard, the cheapest checks first:
//!
//! ```
//! use mcp_id_guard::protect::host::HostPolicy;
//! use mcp_id_guard::protect::ProtectLayer;
//! use mcp_id_guard::IdGuardLayer;
//! use tower::ServiceBuilder;
//!
//! let layers = ServiceBuilder::new()
//!     .layer(ProtectLayer::new(HostPolicy::loopback()))
//!     .layer(IdGuardLayer::new());
//! # let _ = layers;
//! ```
//!
//! which is, layer by layer (each wrapping the response body once more):
//!
//! ```
//! use mcp_id_guard::protect::head::HeadLimitLayer;
//! use mcp_id_guard::protect::host::{HostLayer, HostPolicy};
//! use mcp_id_guard::protect::pace::BodyPaceLayer;
//! use mcp_id_guard::IdGuardLayer;
//! use tower::ServiceBuilder;
//!
//! let layers = ServiceBuilder::new()
//!     .layer(HeadLimitLayer::new(32 * 1024))
//!     .layer(HostLayer::new(HostPolicy::loopback()))
//!     .layer(BodyPaceLayer::new())
//!     .layer(IdGuardLayer::new());
//! # let _ = layers;
//! ```
//!
//! They need no crate feature, and Tokio's timer only for the body's pace.

mod body;
mod bundle;
#[macro_use]
mod future;
pub mod buffer;
pub mod head;
pub mod host;
pub mod metrics;
pub mod pace;
mod refused;
#[cfg(feature = "proxy")]
pub(crate) mod upstream;

pub use body::ProtectedBody;
pub use bundle::{Protect, ProtectFuture, ProtectLayer};
pub use future::ProtectedFuture as HeadCheckFuture;
pub use refused::Refused;

// The path the head checks' `Service` impl (`head_check_service!`) names.
pub(crate) use future::ProtectedFuture;
