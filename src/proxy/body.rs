//! The response body of [`Proxy`](super::Proxy).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use super::BoxError;

/// The response body of [`Proxy`](super::Proxy): the upstream's body, passed
/// on frame by frame as it arrives (server-sent events are never buffered), or
/// the proxy's own `502` error body.
///
/// When the upstream connection breaks mid-body, the body yields an error, so
/// the server in front cuts the client's response instead of ending it as if
/// it were complete; the client can then resume an SSE stream with
/// `Last-Event-ID`. The same happens when the upstream sends nothing for
/// [`idle_timeout`](super::ProxyBuilder::idle_timeout). Dropping the body (the
/// client went away) closes the upstream request.
#[derive(Debug)]
pub struct ProxyBody {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Upstream {
        body: Incoming,
        failed: bool,
        idle: Option<Idle>,
    },
    Local(Full<Bytes>),
}

/// The idle timer of an upstream body. The timer is not reset on every
/// frame (a busy stream would touch the timer wheel per event): frames only
/// record the time, and when the timer fires early it is moved to the last
/// frame plus the limit.
#[derive(Debug)]
struct Idle {
    limit: Duration,
    last_frame: Instant,
    timer: Pin<Box<Sleep>>,
}

/// Why the proxy cut a response body: the upstream sent nothing for this long.
#[derive(Debug)]
struct UpstreamIdle(Duration);

impl fmt::Display for UpstreamIdle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the upstream sent nothing for {:?}", self.0)
    }
}

impl std::error::Error for UpstreamIdle {}

impl ProxyBody {
    pub(crate) fn upstream(body: Incoming, idle_timeout: Option<Duration>) -> Self {
        let idle = idle_timeout.map(|limit| {
            let now = Instant::now();
            Idle {
                limit,
                last_frame: now,
                timer: Box::pin(tokio::time::sleep_until(now + limit)),
            }
        });
        Self {
            kind: Kind::Upstream {
                body,
                failed: false,
                idle,
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
            Kind::Upstream { body, failed, idle } => {
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
                    Poll::Pending => {
                        let Some(idle) = idle else {
                            return Poll::Pending;
                        };
                        loop {
                            if idle.timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            let deadline = idle.last_frame + idle.limit;
                            if deadline > Instant::now() {
                                idle.timer.as_mut().reset(deadline);
                                continue;
                            }
                            *failed = true;
                            tracing::warn!(
                                timeout = ?idle.limit,
                                "upstream response body sent nothing in time; cutting the client's response"
                            );
                            return Poll::Ready(Some(Err(Box::new(UpstreamIdle(idle.limit)))));
                        }
                    }
                    other => {
                        if let Some(idle) = idle {
                            idle.last_frame = Instant::now();
                        }
                        other.map_err(Into::into)
                    }
                }
            }
            Kind::Local(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream { body, failed, .. } => *failed || body.is_end_stream(),
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
