//! The request body's idle timer.
//!
//! Kept apart on purpose: it moves to the body-pace layer
//! (`protect::pace`), which also enforces a minimum data rate; the server
//! will then only hand over hyper's body and close the connection after the
//! layer's `408`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::activity::Activity;

/// A request body as the server hands it to the service: the client's
/// bytes, failing when the client pauses longer than
/// [`request_body_timeout`](super::ServerBuilder::request_body_timeout)
/// while the service waits for them (the connection is closed then).
#[derive(Debug)]
pub struct ClientBody {
    body: hyper::body::Incoming,
    limit: Option<Duration>,
    /// Armed while the reader waits for the client; allocated on first use.
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
    timed_out: bool,
    activity: Arc<Activity>,
}

impl ClientBody {
    pub(crate) fn new(
        body: hyper::body::Incoming,
        limit: Option<Duration>,
        activity: Arc<Activity>,
    ) -> Self {
        Self {
            body,
            limit,
            timer: None,
            waiting: false,
            timed_out: false,
            activity,
        }
    }
}

/// Why a request body failed: the client paused too long.
#[derive(Debug)]
struct BodyTimeout(Duration);

impl fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the client sent no request body data for {:?}", self.0)
    }
}

impl std::error::Error for BodyTimeout {}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.timed_out {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = false;
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => {
                let Some(limit) = this.limit else {
                    return Poll::Pending;
                };
                // The pause counts from when the reader started waiting, not
                // from the last frame: a reader slowed by the upstream is
                // not the client's fault.
                let deadline = Instant::now() + limit;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if !this.waiting {
                    this.waiting = true;
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.timed_out = true;
                this.activity.request_close();
                tracing::debug!(timeout = ?limit, "request body paused too long; closing the connection");
                Poll::Ready(Some(Err(Box::new(BodyTimeout(limit)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
