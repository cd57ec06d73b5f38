//! The kinds of upstream failure the [proxy](crate::proxy) marks its own
//! answers with. Defined here, beside [`Refused`](super::Refused), so that
//! the metrics layer reads both without depending on the proxy; public as
//! `mcp_id_guard::proxy::UpstreamFailure`.

/// Why the proxy answered a request itself instead of the upstream: a
/// response extension on the proxy's own `502`, `503` and `504` answers (it
/// survives the guard), for metrics. Statuses the upstream sends itself carry
/// none.
///
/// ```
/// # use mcp_id_guard::proxy::UpstreamFailure;
/// # let response = http::Response::new(());
/// let kind = response.extensions().get::<UpstreamFailure>().map(|kind| kind.as_str());
/// # assert_eq!(kind, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UpstreamFailure {
    /// The connection was refused or failed (`502`).
    Unreachable,
    /// The upstream did not accept the connection within the connect
    /// timeout (`502`).
    ConnectTimeout,
    /// The connection closed, or carried something that is not HTTP, before
    /// the response headers (`502`).
    FailedBeforeAnswer,
    /// No response headers within
    /// [`response_timeout`](crate::proxy::ProxyBuilder::response_timeout) (`504`).
    ResponseTimeout,
    /// Every upstream connection stayed busy for
    /// [`connection_wait`](crate::proxy::ProxyBuilder::connection_wait) (`503`).
    Busy,
}

impl UpstreamFailure {
    /// Every kind, in declaration order.
    pub const ALL: [Self; 5] = [
        Self::Unreachable,
        Self::ConnectTimeout,
        Self::FailedBeforeAnswer,
        Self::ResponseTimeout,
        Self::Busy,
    ];

    /// A short name, such as `unreachable` or `response_timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::ConnectTimeout => "connect_timeout",
            Self::FailedBeforeAnswer => "failed_before_answer",
            Self::ResponseTimeout => "response_timeout",
            Self::Busy => "busy",
        }
    }
}
