//! [`Refused`]: the kinds of refusal the protection layers answer.

use bytes::Bytes;
use http::Response;
use http_body_util::Full;

use super::body::ProtectedBody;

/// Why a protection layer answered a request itself. Put on the response it
/// gave as an extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refused {
    /// `Host` names no authority the server is reached by (421).
    Host,
    /// `Origin` is a foreign web page's (403).
    Origin,
    /// The request head is over its limit (431).
    HeadSize,
    /// The request body paused longer than its idle limit (408).
    BodyIdle,
    /// The request body arrived slower than the minimum data rate (408).
    BodySlow,
    /// The request arrived on a connection that is closing (503).
    ConnectionClosing,
    /// The request body is over the size cap (413).
    BodyTooLarge,
    /// The request body does not fit what the body budgets have left (503).
    BodyBudget,
}

impl Refused {
    /// The kind's label in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Origin => "origin",
            Self::HeadSize => "header_size",
            Self::BodyIdle => "body_idle",
            Self::BodySlow => "body_slow",
            Self::ConnectionClosing => "connection_closing",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyBudget => "body_budget",
        }
    }
}

/// A refusal as the layers answer it: `answer` (built by `crate::wire::answer`)
/// marked with its kind, in the layers' shared body.
pub(crate) fn refusal<B>(
    kind: Refused,
    answer: Response<Full<Bytes>>,
) -> Response<ProtectedBody<B>> {
    let mut response = answer.map(ProtectedBody::refusal);
    response.extensions_mut().insert(kind);
    response
}
