//! Protections for an MCP server facing the network, each a tower layer that
//! composes with [`IdGuardLayer`](crate::IdGuardLayer) through
//! `ServiceBuilder` or axum's `.layer()`, in front of an rmcp service, an axum
//! router or the [`proxy`](crate::proxy):
//!
//! | layer | refuses | status |
//! |---|---|---|
//! | [`HostLayer`] ([`host`]) | a `Host` or `Origin` its [`HostPolicy`] does not serve (DNS rebinding) | 421 / 403 |
//! | [`HeadLimitLayer`] ([`head`]) | a request head over its limit | 431 |
//! | [`BodyPaceLayer`] ([`pace`]) | a request body that pauses too long or arrives too slowly | 408 |
//! | [`BodyBufferLayer`] ([`buffer`]) | a request body over the size cap, or over what the memory budgets have left | 413 / 503 |
//!
//! Each layer answers what it refuses itself, with a precise HTTP status and
//! a JSON-RPC error, and marks that response with a [`Refused`] extension so
//! that a layer outside it (metrics) can count refusals by kind. Their
//! responses share one body type, [`ProtectedBody`], which keeps the inner
//! body's error type. Put them outside the guard, the cheapest checks first:
//!
//! ```
//! use mcp_id_guard::protect::{BodyPaceLayer, HeadLimitLayer, HostLayer, HostPolicy};
//! use mcp_id_guard::IdGuardLayer;
//! use tower::ServiceBuilder;
//!
//! let layers = ServiceBuilder::new()
//!     .layer(HeadLimitLayer::new(16 * 1024))
//!     .layer(HostLayer::new(HostPolicy::loopback()))
//!     .layer(BodyPaceLayer::new())
//!     .layer(IdGuardLayer::new());
//! # let _ = layers;
//! ```
//!
//! They need no crate feature, and Tokio's timer only for [`BodyPaceLayer`].

mod body;
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
pub use buffer::{BodyBudget, BodyBuffer, BodyBufferLayer, BufferFuture};
pub use future::ProtectedFuture;
pub use head::{HeadLimit, HeadLimitLayer};
pub use host::{HostCheck, HostLayer, HostPolicy, InvalidPattern};
pub use pace::{BodyPace, BodyPaceLayer, PaceError, PaceFuture, PacedBody};
pub use refused::Refused;
