//! The watchdog: one per connection, closing it when a deadline passes.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Poll, Waker};

use tokio::time::Instant;

use super::activity::{Activity, CLOSE_BOUND};
use super::Limits;

/// Drives `connection` until it ends, closing it when its deadline passes
/// (see [`Limits`](super::Limits)), when a request body timed out, or gracefully when the
/// server shuts down (`shutdown` turns `true`). `graceful` asks the
/// connection to finish its requests in progress and close.
///
/// The connection comes boxed: held in place, it would be stored in the
/// task's future once per await point it crosses (its 1.7 KiB three times
/// over in every connection's task), and an idle connection's memory is
/// mostly that task.
///
/// The watchdog is not woken for each request: a request ending, or the
/// first byte of the next head arriving, can only set a deadline at least
/// the shortest of the header-read and keep-alive limits after it happens,
/// so the watchdog looks again at its deadline or after that shortest limit,
/// whichever comes first, and works out the deadline then. Busy connections
/// thus cost no timer or wake-up per request.
pub(crate) async fn drive<C, E, A>(
    mut connection: Pin<Box<C>>,
    graceful: impl Fn(Pin<&mut C>),
    activity: Arc<Activity>,
    limits: Limits,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    peer: A,
) where
    A: fmt::Debug,
    C: Future<Output = Result<(), E>>,
    E: fmt::Display,
{
    let shortest = [limits.header_read, limits.keep_alive]
        .into_iter()
        .flatten()
        .min();
    // Dropped before the connection (declared after it).
    let _gone = Gone(&activity);
    // Whether shutdown was signalled is looked at through a copy of the
    // receiver: `stop` holds the original.
    let mut signalled = shutdown.clone();
    let mut stop = std::pin::pin!(shutdown.wait_for(|stop| *stop));
    let timer = tokio::time::sleep_until(Instant::now());
    let mut timer = std::pin::pin!(timer);
    let mut armed: Option<Instant> = None;
    let mut closing = false;
    let mut hard_deadline: Option<Instant> = None;
    // The task's waker that `stop` and `timer` hold; `None`: they must be
    // polled to register one.
    let mut registered: Option<Waker> = None;
    // `timer` was reset since it was last polled.
    let mut timer_reset = true;
    loop {
        let now = Instant::now();
        let signals = activity.signals.load(Ordering::SeqCst);
        // A connection told to close (shutdown, or a request that still had
        // to finish) keeps its head and keep-alive deadlines: a client that
        // never finishes its head, or never acknowledges HTTP/2's GOAWAY,
        // would otherwise hold shutdown for the whole grace period.
        let mut deadline = match hard_deadline.filter(|_| closing) {
            Some(at) => Some((at, "did not close in time")),
            // Closed for a timeout, with the requests that were let finish
            // now done: a stalled HTTP/2 stream that hyper still holds must
            // not keep the connection for the keep-alive limit.
            None if closing && activity.close.load(Ordering::Relaxed) => {
                activity.closing_deadline()
            }
            None => activity.deadline(&limits),
        };
        if let Some(send_at) = activity.send_deadline(&limits) {
            if deadline.is_none_or(|(at, _)| send_at < at) {
                deadline = Some((send_at, "the client did not read its response in time"));
            }
        }
        if let Some((_, why)) = deadline.filter(|(at, _)| *at <= now) {
            if activity
                .send_deadline(&limits)
                .is_some_and(|send_at| send_at <= now)
            {
                // Nothing more can be written to this client: drop the
                // connection (and with it the upstream request).
                tracing::debug!(?peer, "dropping connection: {why}");
                return;
            }
            if closing {
                if activity.active.load(Ordering::Acquire) == 0 {
                    tracing::debug!(?peer, "closing connection: {why}");
                    return;
                }
                // A request arrived meanwhile; let it finish.
                hard_deadline = None;
            } else {
                tracing::debug!(?peer, "closing connection: {why}");
                closing = true;
                graceful(connection.as_mut());
                hard_deadline = Some(now + CLOSE_BOUND);
            }
            continue;
        }
        let bound = shortest
            .filter(|_| !closing || hard_deadline.is_none())
            .map(|limit| now + limit);
        let look = match (deadline.map(|(at, _)| at), bound) {
            (Some(at), Some(bound)) => Some(at.min(bound)),
            (at, bound) => at.or(bound),
        };
        if let Some(look) = look {
            if armed != Some(look) {
                timer.as_mut().reset(look);
                armed = Some(look);
                timer_reset = true;
            }
        }
        // The connection is polled each time one of its sockets is ready,
        // several times per request: the watchdog's own sources are polled
        // again only when a cheap look says one may have fired, or when the
        // task's waker changed (they hold the old one). Each wait registers
        // with `watchdog` once (and again for a new waker), then reads the
        // count of signals (see `Activity::signals`).
        let mut first = true;
        let event = poll_fn(|cx| {
            if let Poll::Ready(result) = connection.as_mut().poll(cx) {
                return Poll::Ready(Event::Ended(result));
            }
            let stale = !registered
                .as_ref()
                .is_some_and(|waker| waker.will_wake(cx.waker()));
            if stale {
                registered = Some(cx.waker().clone());
            }
            if first || stale {
                first = false;
                activity.watchdog.register(cx.waker());
            }
            if activity.signals.load(Ordering::SeqCst) != signals {
                return Poll::Ready(Event::Changed);
            }
            if !closing && (stale || signalled.has_changed().unwrap_or(true)) {
                // Marked seen before `stop` reads the value, so a change
                // that lands after this shows up again at the next look.
                signalled.mark_unchanged();
                if stop.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Stop);
                }
            }
            if look.is_some() && (stale || timer_reset || timer.is_elapsed()) {
                timer_reset = false;
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Timer);
                }
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Ended(result) => {
                if let Err(error) = result {
                    tracing::debug!(?peer, %error, "connection ended with an error");
                }
                return;
            }
            Event::Stop => {
                closing = true;
                graceful(connection.as_mut());
            }
            Event::Changed => {
                if !closing && activity.close.load(Ordering::Relaxed) {
                    if let Some(reason) = activity.closing() {
                        tracing::debug!(?peer, "closing connection: {}", reason.why());
                    }
                    closing = true;
                    graceful(connection.as_mut());
                    hard_deadline = Some(Instant::now() + CLOSE_BOUND);
                }
            }
            Event::Timer => armed = None,
        }
    }
}

/// Marks the connection's end for its bodies (see [`Activity::gone`]).
struct Gone<'a>(&'a Activity);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        self.0.gone.store(true, Ordering::Release);
    }
}

/// What ended one wait of the watchdog.
enum Event<E> {
    /// The connection finished.
    Ended(Result<(), E>),
    /// The server shuts down.
    Stop,
    /// A request body timed out or a write got blocked.
    Changed,
    /// The time to look again came.
    Timer,
}
