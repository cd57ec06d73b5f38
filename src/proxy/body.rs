//! The response body of [`Proxy`](super::Proxy).

use std::collections::VecDeque;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use super::pool::Lease;
use super::BoxError;
use crate::throttle::Shared;

/// The response body of [`Proxy`](super::Proxy): the upstream's body, passed
/// on as it arrives (server-sent events are never held back: what has arrived
/// together, up to 64 KiB, goes on together), or the proxy's own `502` error
/// body.
///
/// When the upstream connection breaks mid-body, the body yields an error, so
/// the server in front cuts the client's response instead of ending it as if
/// it were complete; the client can then resume an SSE stream with
/// `Last-Event-ID`. The same happens when the upstream sends nothing for
/// [`idle_timeout`](super::ProxyBuilder::idle_timeout). Dropping the body (the
/// client went away) closes the upstream request.
#[derive(Debug)]
pub struct ProxyBody {
    source: Source,
}

#[derive(Debug)]
enum Source {
    Upstream(Box<UpstreamBody>),
    Local(Full<Bytes>),
}

/// At most this many frames are taken ahead by [`ProxyBody::gather`]: hyper
/// queues at most 16 buffers per write, the response head included.
const GATHER_FRAMES: usize = 8;
/// At most this many bytes are taken ahead by [`ProxyBody::gather`], so a
/// large answer still streams.
const GATHER_BYTES: usize = 64 * 1024;

/// An upstream body, with the frames already taken from it.
#[derive(Debug)]
struct UpstreamBody {
    body: Incoming,
    /// The connection the body arrives on, driven by this body's reader
    /// (see [`pool`](super::pool)); given back once the body has ended.
    lease: Option<Lease>,
    /// Frames taken ahead (see [`ProxyBody::gather`]), passed on first.
    ready: VecDeque<Frame<Bytes>>,
    /// The error that came after `ready`.
    broken: Option<BoxError>,
    /// The upstream body ended after `ready`.
    ended: bool,
    /// The body yielded its error (or timed out): nothing follows.
    failed: bool,
    /// hyper has had the chance to write what came before `broken`.
    flushed: bool,
    idle: Option<IdleTimer>,
}

/// The idle timer of an upstream body. The timer is not reset on every
/// frame (a busy stream would touch the timer wheel per event): frames only
/// mark that something came, the time is read when the body next has to
/// wait (the quiet spell starts then), and when the timer fires early it is
/// moved to that time plus the limit. It is created the first time the body
/// has to wait, so an answer that arrives whole never touches the timer
/// wheel or reads the clock.
#[derive(Debug)]
struct IdleTimer {
    limit: Duration,
    /// When the body started to wait after the last frame it took (or the
    /// head); `None` until it waits again after taking one.
    quiet_since: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
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
    pub(crate) fn upstream(body: Incoming, lease: Lease, idle_timeout: Option<Duration>) -> Self {
        let idle = idle_timeout.map(|limit| IdleTimer {
            limit,
            quiet_since: None,
            timer: None,
        });
        Self {
            source: Source::Upstream(Box::new(UpstreamBody {
                body,
                lease: Some(lease),
                ready: VecDeque::new(),
                broken: None,
                ended: false,
                failed: false,
                flushed: false,
                idle,
            })),
        }
    }

    pub(crate) fn local(body: Full<Bytes>) -> Self {
        Self {
            source: Source::Local(body),
        }
    }

    /// Takes the frames the upstream has already sent, before the response
    /// is handed on, so that a small answer that arrived whole leaves in one
    /// write with its head and its end (see [`Upstream::fill`]).
    pub(crate) async fn gather(&mut self) {
        if let Source::Upstream(upstream) = &mut self.source {
            poll_fn(|cx| {
                // Whatever came, the response goes on now.
                let _ = upstream.fill(cx);
                Poll::Ready(())
            })
            .await;
        }
    }
}

impl UpstreamBody {
    /// Takes into `ready` what the upstream has already sent: drives the
    /// connection (hyper passes a body on one chunk at a time, the next once
    /// the last is taken) and takes each frame, until the connection has had
    /// its turn and nothing more is there. `Pending` when nothing at all has
    /// come.
    ///
    /// Why: hyper writes what it has to the client whenever the body it
    /// sends says `Pending`, and writes the end of a chunked body on its own
    /// unless the last chunk comes with `is_end_stream()`. Passing each
    /// chunk as it came made three writes of a two-event SSE answer (each a
    /// round through the loopback TCP stack and a wake-up of the client);
    /// gathered, it is one. A stream whose next event is not there yet is
    /// never held back. Bounded by [`GATHER_FRAMES`] and [`GATHER_BYTES`].
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut took = false;
        let mut bytes: usize = self
            .ready
            .iter()
            .filter_map(Frame::data_ref)
            .map(Buf::remaining)
            .sum();
        let polled = loop {
            if self.ended
                || self.broken.is_some()
                || self.ready.len() >= GATHER_FRAMES
                || bytes >= GATHER_BYTES
            {
                break Poll::Ready(());
            }
            if let Some(lease) = &mut self.lease {
                lease.connection.drive(cx);
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    bytes += frame.data_ref().map_or(0, Buf::remaining);
                    self.ready.push_back(frame);
                    took = true;
                    // hyper's server stops polling (and drops the body) once
                    // it says it has ended, so the end is taken here too: the
                    // connection goes back before that.
                    if self.body.is_end_stream() {
                        self.ended = true;
                        if let Some(lease) = self.lease.take() {
                            lease.release(cx);
                        }
                    }
                }
                Poll::Ready(Some(Err(error))) => {
                    self.broken = Some(error.into());
                    // Broken mid-answer: closed, not reused.
                    self.lease = None;
                }
                Poll::Ready(None) => {
                    self.ended = true;
                    if let Some(lease) = self.lease.take() {
                        lease.release(cx);
                    }
                }
                Poll::Pending if self.ready.is_empty() => break Poll::Pending,
                Poll::Pending => break Poll::Ready(()),
            }
        };
        if took {
            if let Some(idle) = &mut self.idle {
                idle.quiet_since = None;
            }
        }
        polled
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ready.is_empty() && !self.failed && self.fill(cx).is_pending() {
            return self.poll_idle(cx);
        }
        if let Some(frame) = self.ready.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.broken.is_some() && !self.flushed {
            // hyper drops what it has not written yet when a body fails:
            // one `Pending` first, so the frames taken ahead (and the head)
            // reach the client before the cut.
            self.flushed = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Some(error) = self.broken.take() {
            self.failed = true;
            if let Some(suppressed) = Shared::UpstreamBodyBroke.due() {
                tracing::warn!(
                    error = %super::error_chain(&*error),
                    "upstream response body broke off; cutting the client's response \
                     ({suppressed} more since the last such line)"
                );
            }
            return Poll::Ready(Some(Err(error)));
        }
        Poll::Ready(None)
    }

    /// Nothing has come: fails the body once the upstream has sent nothing
    /// for the idle limit.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(idle) = &mut self.idle else {
            return Poll::Pending;
        };
        let deadline = *idle.quiet_since.get_or_insert_with(Instant::now) + idle.limit;
        let timer = idle
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if deadline > Instant::now() {
                timer.as_mut().reset(deadline);
                continue;
            }
            self.failed = true;
            // Silent mid-answer: closed, not reused.
            self.lease = None;
            if let Some(suppressed) = Shared::UpstreamBodyIdle.due() {
                tracing::warn!(
                    timeout = ?idle.limit,
                    "upstream response body sent nothing in time; cutting the client's response \
                     ({suppressed} more since the last such line)"
                );
            }
            return Poll::Ready(Some(Err(Box::new(UpstreamIdle(idle.limit)))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ready.is_empty()
            && self.broken.is_none()
            && (self.failed || self.ended || self.body.is_end_stream())
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.source {
            Source::Upstream(upstream) => upstream.poll_frame(cx),
            Source::Local(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Upstream(upstream) => upstream.is_end_stream(),
            Source::Local(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Upstream(upstream) => {
                // Frames taken ahead are no longer in the upstream's hint.
                let ahead: u64 = upstream
                    .ready
                    .iter()
                    .filter_map(Frame::data_ref)
                    .map(|data| data.len() as u64)
                    .sum();
                let rest = upstream.body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(ahead));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(ahead));
                }
                hint
            }
            Source::Local(body) => body.size_hint(),
        }
    }
}
