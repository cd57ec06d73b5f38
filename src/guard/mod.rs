//! The tower face of the guard: [`IdGuardLayer`] wraps a service in
//! [`IdGuard`], which reads each POST's envelope, asks the session table
//! for a decision ([`admit`]), and follows the response until the id is
//! released.

mod admit;
pub(crate) mod body;
pub(crate) mod exchange;
mod future;
mod layer;
mod service;
mod unanswered;

pub use crate::table::OnDuplicate;
pub use crate::wire::method::McpMethod;
pub use body::{RequestBody, ResponseBody};
pub use exchange::{Exchange, GuardDecision, Handled, WantsExchange};
pub use future::ResponseFuture;
pub use layer::IdGuardLayer;
pub use service::IdGuard;
pub use unanswered::Unanswered;
