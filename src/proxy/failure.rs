//! The answers the proxy gives in the upstream's place (`502`, `503`, `504`
//! and `400` for a body that could not be read): JSON-RPC errors carrying
//! the ids of the request, and the log lines that go with them.

use http::{Method, Response, StatusCode};

use super::body::ProxyBody;
use super::pool::Failure;
use super::upstream::Url;
use super::{Shared, UpstreamFailure, INTERNAL_ERROR};
use crate::guard::Unanswered;
use crate::wire::answer;
use crate::wire::envelope::{peek, Peeked};

impl Shared {
    /// The proxy's answer in the upstream's place when a request got no
    /// response: `504`, `503` or `502` with a JSON-RPC error carrying the
    /// request's ids (`read`), marked with whether it reached the upstream.
    pub(super) fn stand_in(
        &self,
        failure: Failure,
        read: Option<&[u8]>,
        (method, uri): (&Method, &Url<'_>),
    ) -> Response<ProxyBody> {
        // The guard in front frees the request's ids only if the upstream
        // cannot have it: this answer is no response from the server.
        let unanswered = if failure.sent() {
            Unanswered::Sent
        } else {
            Unanswered::NotSent
        };
        let mut response = match failure {
            Failure::Timeout { .. } => {
                if let Some(suppressed) = self.warnings.ready(UpstreamFailure::ResponseTimeout) {
                    tracing::warn!(
                        %method,
                        %uri,
                        timeout = ?self.response_timeout.unwrap_or_default(),
                        "upstream sent no response headers in time; answered 504 \
                         ({suppressed} more since the last such line)"
                    );
                }
                failed(
                    UpstreamFailure::ResponseTimeout,
                    StatusCode::GATEWAY_TIMEOUT,
                    &ErrorIds::sent(read),
                    INTERNAL_ERROR,
                    "Gateway Timeout: the upstream MCP server did not answer in time",
                )
            }
            Failure::Busy(busy) => {
                if let Some(suppressed) = self.warnings.ready(UpstreamFailure::Busy) {
                    tracing::warn!(
                        %method,
                        %uri,
                        "{busy}; answered 503 ({suppressed} more since the last such line)"
                    );
                }
                failed(
                    UpstreamFailure::Busy,
                    StatusCode::SERVICE_UNAVAILABLE,
                    &ErrorIds::sent(read),
                    answer::SERVER_ERROR,
                    "Service Unavailable: every upstream connection is busy; retry later",
                )
            }
            Failure::Send { error, .. } => self.bad_gateway(
                UpstreamFailure::FailedBeforeAnswer,
                "Bad Gateway: the upstream MCP server failed before answering",
                &error,
                (method, uri),
                &ErrorIds::sent(read),
            ),
            Failure::Connect(error) if is_timeout(&*error) => self.bad_gateway(
                UpstreamFailure::ConnectTimeout,
                "Bad Gateway: the upstream MCP server did not accept the connection in time",
                &*error,
                (method, uri),
                &ErrorIds::sent(read),
            ),
            Failure::Connect(error) => self.bad_gateway(
                UpstreamFailure::Unreachable,
                "Bad Gateway: the upstream MCP server could not be reached",
                &*error,
                (method, uri),
                &ErrorIds::sent(read),
            ),
        };
        response.extensions_mut().insert(unanswered);
        response
    }

    /// `502` with a JSON-RPC error, logged once per interval and kind: an
    /// upstream that is down fails every request, and one line with the
    /// count says so better than one per request.
    pub(super) fn bad_gateway(
        &self,
        failure: UpstreamFailure,
        message: &str,
        error: &(dyn std::error::Error + 'static),
        (method, uri): (&Method, &Url<'_>),
        ids: &ErrorIds,
    ) -> Response<ProxyBody> {
        if let Some(suppressed) = self.warnings.ready(failure) {
            tracing::warn!(
                %method,
                %uri,
                error = %error_chain(error),
                connect_timeout = ?self.connect_timeout,
                "upstream request failed; answered 502 ({suppressed} more {} since the last such line)",
                failure.as_str(),
            );
        }
        failed(
            failure,
            StatusCode::BAD_GATEWAY,
            ids,
            INTERNAL_ERROR,
            message,
        )
    }
}

/// The ids of the requests in a body, as JSON text, for an error answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ErrorIds {
    Null,
    Single(String),
    Batch(Vec<String>),
}

impl ErrorIds {
    /// The ids of a request body that was read (`None`: it was not).
    pub(super) fn sent(body: Option<&[u8]>) -> Self {
        body.map_or(Self::Null, Self::of)
    }

    fn of(body: &[u8]) -> Self {
        let Some(peeked) = peek(body) else {
            return Self::Null;
        };
        let mut ids: Vec<String> = peeked
            .request_ids(body)
            .map(|(_, text)| text.to_owned())
            .collect();
        match peeked {
            Peeked::Single(_) => ids.pop().map_or(Self::Null, Self::Single),
            Peeked::Batch(_) if ids.is_empty() => Self::Null,
            Peeked::Batch(_) => Self::Batch(ids),
        }
    }
}

/// An answer to a request the upstream could not answer, marked with why.
fn failed(
    failure: UpstreamFailure,
    status: StatusCode,
    ids: &ErrorIds,
    code: i32,
    message: &str,
) -> Response<ProxyBody> {
    let mut response = local(status, ids, code, message);
    response.extensions_mut().insert(failure);
    response
}

/// An answer the proxy gives itself: a JSON-RPC error per id.
pub(super) fn local(
    status: StatusCode,
    ids: &ErrorIds,
    code: i32,
    message: &str,
) -> Response<ProxyBody> {
    let response = match ids {
        ErrorIds::Null => answer::single(status, "null", code, message),
        ErrorIds::Single(id) => answer::single(status, id, code, message),
        ErrorIds::Batch(ids) => {
            answer::batch(status, code, ids.iter().map(|id| (id.as_str(), message)))
        }
    };
    response.map(ProxyBody::local)
}

/// Whether an upstream error was a connect timeout.
fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        if error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = error.source();
    }
    false
}

/// An error and its sources, `: `-separated, for one log line.
pub(super) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(error) = source {
        let next = error.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = error.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[test]
    fn error_ids() {
        assert_eq!(
            ErrorIds::of(br#"{"jsonrpc":"2.0","id":"a","method":"m"}"#),
            ErrorIds::Single(r#""a""#.into())
        );
        assert_eq!(
            ErrorIds::of(br#"{"jsonrpc":"2.0","method":"notifications/x"}"#),
            ErrorIds::Null
        );
        assert_eq!(
            ErrorIds::of(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
            ErrorIds::Null
        );
        assert_eq!(
            ErrorIds::of(br#"[{"id":1,"method":"a"},{"method":"n"},{"id":2,"method":"b"}]"#),
            ErrorIds::Batch(vec!["1".into(), "2".into()])
        );
        assert_eq!(ErrorIds::of(b"not json"), ErrorIds::Null);
    }

    #[test]
    fn timeouts_are_found_in_the_chain() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("tcp connect error")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let timed_out = Outer(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connect timed out",
        ));
        assert!(is_timeout(&timed_out));
        assert_eq!(
            error_chain(&timed_out),
            "tcp connect error: connect timed out"
        );
        let refused = Outer(std::io::ErrorKind::ConnectionRefused.into());
        assert!(!is_timeout(&refused));
    }
}
