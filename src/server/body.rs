//! The response body the server hands to hyper: it keeps its request active
//! for the watchdog and gives up on a client that reads nothing.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::activity::{ActiveRequest, Activity, NONE};

/// A response body that keeps its request active until it is dropped
/// (sent whole, or abandoned with the connection), and that gives up on a
/// client that takes nothing for the send limit.
///
/// The server gives it a send limit only on HTTP/2 (on HTTP/1.1 a client that
/// reads nothing blocks the socket's writes, which the watchdog times out).
/// The blocked-write rule of the watchdog does not see an HTTP/2 stream
/// whose flow-control window the client never opens: the socket stays
/// writable, hyper just stops asking the body for data (and with it stop
/// the upstream's idle timer, which runs only when the body is polled).
/// So once a frame has been handed over and the body is not done, a timer
/// task of the response's own watches for the next poll: when none comes
/// within the limit, it drops the body at once (freeing the upstream
/// connection and ending the request's exchange), fails the next poll (hyper
/// resets the stream if it ever polls again) and has the connection closed,
/// which resets the stream the client holds.
pub(crate) struct Tracked<B: Body> {
    state: Phase<B>,
    send: Option<Duration>,
    /// The stall error was returned: the body is over.
    failed: bool,
}

enum Phase<B> {
    /// No frame handed over yet, or no send limit: no timer.
    Plain(B, ActiveRequest),
    /// Watched by a stall timer, which may take the body away.
    Watched(Arc<Stall<B>>),
    /// Only while moving from `Plain` to `Watched`.
    Moving,
}

/// A streaming response's body, shared with its stall timer.
struct Stall<B> {
    /// The body and its request's token; `None` once the timer gave up.
    slot: std::sync::Mutex<Option<(B, ActiveRequest)>>,
    activity: Arc<Activity>,
    /// When a frame was handed over that hyper has not followed with another
    /// poll (ms since the connection's start), or `NONE`.
    handed: AtomicU64,
    /// The response was dropped: the timer ends.
    ended: tokio::sync::Notify,
}

impl<B> Stall<B> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(B, ActiveRequest)>> {
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why a response body failed: the client took nothing for the send limit.
#[derive(Debug)]
struct SendStalled(Duration);

impl fmt::Display for SendStalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the client took no response data for {:?}", self.0)
    }
}

impl std::error::Error for SendStalled {}

impl<B: Body> Tracked<B> {
    pub(crate) fn new(body: B, active: ActiveRequest, send: Option<Duration>) -> Self {
        Self {
            state: Phase::Plain(body, active),
            send,
            failed: false,
        }
    }
}

/// hyper drops a body without polling it to its end once it says it is
/// over (after its last data frame, or at once when empty): that is an end,
/// not a client's reset.
fn note_end_at_drop<B: Body>(body: &B, active: &mut ActiveRequest) {
    if body.is_end_stream() {
        active.ended = true;
    }
}

impl<B: Body> Drop for Tracked<B> {
    fn drop(&mut self) {
        match &mut self.state {
            Phase::Plain(body, active) => note_end_at_drop(body, active),
            Phase::Watched(stall) => {
                // The body and token go now, not when the timer next wakes.
                if let Some((body, mut active)) = stall.lock().take() {
                    note_end_at_drop(&body, &mut active);
                }
                stall.ended.notify_one();
            }
            Phase::Moving => {}
        }
    }
}

/// Gives up on `stall`'s response once a handed-over frame has not been
/// followed by a poll for `limit` (see [`Tracked`]).
async fn watch_stall<B>(stall: Arc<Stall<B>>, limit: Duration) {
    loop {
        let handed = stall.handed.load(Ordering::Acquire);
        // While hyper polls (or the body waits for the upstream) nothing is
        // stalled; look again a limit later.
        let at = if handed == NONE {
            Instant::now() + limit
        } else {
            stall.activity.at(handed) + limit
        };
        if handed != NONE && at <= Instant::now() {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(at) => {}
            () = stall.ended.notified() => return,
        }
    }
    let Some(taken) = stall.lock().take() else {
        return;
    };
    tracing::debug!(
        timeout = ?limit,
        "the client took no response data in time; dropping the response and closing the connection"
    );
    drop(taken);
    stall.activity.request_close();
}

impl<B> Body for Tracked<B>
where
    B: Body + Unpin + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let stall = match &mut this.state {
            Phase::Plain(body, active) => {
                let polled = Pin::new(&mut *body).poll_frame(cx);
                // An error ends the stream too: hyper resets it then, not
                // the client.
                if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
                    active.ended = true;
                }
                let (Some(limit), Poll::Ready(Some(Ok(_)))) = (this.send, &polled) else {
                    return polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)));
                };
                if body.is_end_stream() {
                    return polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)));
                }
                // A frame handed over and more to come: from now on the
                // response is watched.
                let Phase::Plain(body, active) = std::mem::replace(&mut this.state, Phase::Moving)
                else {
                    unreachable!("matched above")
                };
                let activity = Arc::clone(&active.activity);
                let stall = Arc::new(Stall {
                    handed: AtomicU64::new(activity.now_ms()),
                    activity,
                    slot: std::sync::Mutex::new(Some((body, active))),
                    ended: tokio::sync::Notify::new(),
                });
                tokio::spawn(watch_stall(Arc::clone(&stall), limit));
                this.state = Phase::Watched(stall);
                return polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)));
            }
            Phase::Watched(stall) => stall,
            Phase::Moving => return Poll::Ready(None),
        };
        if this.failed {
            return Poll::Ready(None);
        }
        stall.handed.store(NONE, Ordering::Release);
        let mut slot = stall.lock();
        let Some((body, active)) = slot.as_mut() else {
            this.failed = true;
            let limit = this.send.unwrap_or_default();
            return Poll::Ready(Some(Err(Box::new(SendStalled(limit)))));
        };
        let polled = Pin::new(&mut *body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            active.ended = true;
        }
        if matches!(polled, Poll::Ready(Some(Ok(_)))) && !body.is_end_stream() {
            stall
                .handed
                .store(stall.activity.now_ms(), Ordering::Release);
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            Phase::Plain(body, _) => body.is_end_stream(),
            Phase::Watched(stall) => {
                self.failed
                    || stall
                        .lock()
                        .as_ref()
                        .is_some_and(|(body, _)| body.is_end_stream())
            }
            Phase::Moving => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            Phase::Plain(body, _) => body.size_hint(),
            Phase::Watched(stall) => stall
                .lock()
                .as_ref()
                .map_or_else(SizeHint::default, |(body, _)| body.size_hint()),
            Phase::Moving => SizeHint::with_exact(0),
        }
    }
}
