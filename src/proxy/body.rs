//! The response body of [`Proxy`](super::Proxy).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;

use super::BoxError;

/// The response body of [`Proxy`](super::Proxy): the upstream's body, passed
/// on frame by frame as it arrives (server-sent events are never buffered), or
/// the proxy's own `502` error body.
///
/// When the upstream connection breaks mid-body, the body yields an error, so
/// the server in front cuts the client's response instead of ending it as if
/// it were complete; the client can then resume an SSE stream with
/// `Last-Event-ID`. Dropping the body (the client went away) closes the
/// upstream request.
#[derive(Debug)]
pub struct ProxyBody {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Upstream { body: Incoming, failed: bool },
    Local(Full<Bytes>),
}

impl ProxyBody {
    pub(crate) fn upstream(body: Incoming) -> Self {
        Self {
            kind: Kind::Upstream {
                body,
                failed: false,
            },
        }
    }

    pub(crate) fn local(body: Full<Bytes>) -> Self {
        Self {
            kind: Kind::Local(body),
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Upstream { body, failed } => {
                if *failed {
                    return Poll::Ready(None);
                }
                match Pin::new(body).poll_frame(cx) {
                    Poll::Ready(Some(Err(error))) => {
                        *failed = true;
                        tracing::warn!(
                            error = %super::error_chain(&error),
                            "upstream response body broke off; cutting the client's response"
                        );
                        Poll::Ready(Some(Err(error.into())))
                    }
                    other => other.map_err(Into::into),
                }
            }
            Kind::Local(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream { body, failed } => *failed || body.is_end_stream(),
            Kind::Local(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream { body, .. } => body.size_hint(),
            Kind::Local(body) => body.size_hint(),
        }
    }
}
