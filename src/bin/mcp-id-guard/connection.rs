//! One client connection's timers: how long it may take to send a request
//! head (protocol detection and the HTTP/2 preface included), how long it may
//! stay idle between requests, and how long a request body may pause.
//!
//! hyper's own header timer covers neither hyper-util's protocol detection
//! (which reads the first bytes with no timer at all) nor HTTP/2, so a
//! connection that sends nothing, part of the HTTP/2 preface, or the preface
//! and then silence would stay open for ever. Here one watchdog per connection
//! knows whether a request is in progress (from the service and the response
//! body) and whether bytes have arrived since the connection went idle (from
//! the socket), and closes the connection when its deadline passes.
//!
//! It also bounds what one connection may make the upstream do: how many
//! requests it may carry, and how many HTTP/2 streams its client may reset
//! before their response ended (a "rapid reset" that completes each request
//! first, so that hyper's own limit on resets of streams not yet accepted
//! never sees it). Past either, the connection is closed gracefully (GOAWAY
//! on HTTP/2) and what still arrives on it is answered here, not forwarded.

use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// "No time recorded".
const NONE: u64 = u64::MAX;

/// How long a connection that was told to close may take to do so before it
/// is dropped (when no request is in progress on it).
const CLOSE_BOUND: Duration = Duration::from_millis(100);

/// The client-side time limits; `None` turns one off.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// From the connection's start (or, on HTTP/1.1, the first byte of a
    /// later request) to a whole request head.
    pub(crate) header_read: Option<Duration>,
    /// Between requests on a kept-alive connection.
    pub(crate) keep_alive: Option<Duration>,
    /// A request body's longest pause.
    pub(crate) body_idle: Option<Duration>,
    /// The longest a write to the client may stay blocked (the client does
    /// not read what it asked for).
    pub(crate) send: Option<Duration>,
    /// Requests one connection may carry.
    pub(crate) max_requests: Option<u64>,
    /// Streams an HTTP/2 client may reset before their response ended.
    pub(crate) resets: Option<ResetBudget>,
}

/// How many HTTP/2 streams a client may reset before their response ended:
/// the connection closes once `max` were, within one `window`, and they are
/// at least half the streams it opened in that window (so that a busy client
/// that cancels some of its calls is not cut).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResetBudget {
    pub(crate) max: u32,
    pub(crate) window: Duration,
}

/// Why the proxy closes a connection that its client would keep open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closing {
    /// The connection carried its --max-requests-per-connection.
    RequestCap,
    /// Its client reset too many streams (--max-client-resets).
    ClientResets,
}

impl Closing {
    const fn code(self) -> u8 {
        match self {
            Self::RequestCap => 1,
            Self::ClientResets => 2,
        }
    }

    const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::RequestCap),
            2 => Some(Self::ClientResets),
            _ => None,
        }
    }

    /// The label of `mcp_id_guard_connections_closed_total`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::RequestCap => "request_cap",
            Self::ClientResets => "client_resets",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Self::RequestCap => "it carried its last request (--max-requests-per-connection)",
            Self::ClientResets => {
                "its client reset too many streams before their response (--max-client-resets)"
            }
        }
    }
}

/// What a request that has just arrived may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Go to the upstream.
    Serve,
    /// Go to the upstream; it is the connection's last (HTTP/1.1: answer it
    /// with `Connection: close`).
    Last,
    /// The connection is closing (see [`Closing`]): answer it here.
    Refuse(Closing),
}

/// The current reset window (see [`ResetBudget`]).
#[derive(Debug, Default)]
struct ResetWindow {
    /// When the window started (ms since the connection's start).
    started: u64,
    /// `Activity::streams` when it started.
    streams_before: u64,
    resets: u32,
}

/// What the watchdog knows about one connection, shared with its socket, its
/// requests and their bodies.
#[derive(Debug)]
pub(crate) struct Activity {
    start: Instant,
    /// Requests whose response has not been sent whole yet.
    active: AtomicUsize,
    /// Since when no request has been active (ms since `start`).
    idle_since: AtomicU64,
    /// When the first byte arrived while idle (ms since `start`), or `NONE`.
    head_started: AtomicU64,
    /// Whether a request has arrived (protocol detection is over).
    served: AtomicBool,
    /// Whether the connection speaks HTTP/2, where bytes arrive while idle
    /// (pings, settings) and do not start a request head.
    http2: AtomicBool,
    /// Since when a write to the client has been blocked (ms since
    /// `start`), or `NONE`.
    write_blocked: AtomicU64,
    /// A request body timed out, or a [`Closing`] budget ran out: close the
    /// connection.
    close: AtomicBool,
    /// Requests that arrived on the connection.
    requests: AtomicU64,
    /// [`Closing::code`] once the connection is closing for a budget, else 0.
    closing: AtomicU8,
    max_requests: Option<u64>,
    resets: Option<ResetBudget>,
    /// HTTP/2 streams (requests) that arrived on the connection.
    streams: AtomicU64,
    /// Only locked when the client resets a stream (and the connection has
    /// a reset budget): nothing per request but a count.
    reset_window: Mutex<ResetWindow>,
    /// The watchdog has let go of the connection: bodies dropped from now on
    /// are dropped with it, not reset by the client.
    gone: AtomicBool,
    metrics: Option<Arc<crate::admin::Metrics>>,
    /// How many times the watchdog was woken: the connection must close
    /// early (a request body timed out) or a write to the client got
    /// blocked. Counted before each wake-up, so the watchdog, which reads
    /// the count after registering its waker, misses none, and registers
    /// again only after one (or when its waker changes).
    signals: AtomicU64,
    watchdog: AtomicWaker,
}

impl Activity {
    pub(crate) fn new(limits: &Limits, metrics: Option<Arc<crate::admin::Metrics>>) -> Arc<Self> {
        Arc::new(Self {
            requests: AtomicU64::new(0),
            closing: AtomicU8::new(0),
            max_requests: limits.max_requests,
            resets: limits.resets,
            streams: AtomicU64::new(0),
            reset_window: Mutex::new(ResetWindow::default()),
            gone: AtomicBool::new(false),
            metrics,
            start: Instant::now(),
            active: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(NONE),
            write_blocked: AtomicU64::new(NONE),
            served: AtomicBool::new(false),
            http2: AtomicBool::new(false),
            close: AtomicBool::new(false),
            signals: AtomicU64::new(0),
            watchdog: AtomicWaker::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    /// A request has arrived; it is active until the returned token (moved
    /// into its response body) is dropped. The admission says whether it may
    /// go to the upstream.
    pub(crate) fn request_started(self: &Arc<Self>, http2: bool) -> (ActiveRequest, Admission) {
        self.served.store(true, Ordering::Relaxed);
        if http2 {
            self.http2.store(true, Ordering::Relaxed);
        }
        self.active.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(NONE, Ordering::Relaxed);
        let count = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let admission = if let Some(closing) = self.closing() {
            Admission::Refuse(closing)
        } else if self.max_requests.is_some_and(|max| count >= max) {
            if self.close_for(Closing::RequestCap) {
                Admission::Last
            } else {
                Admission::Refuse(self.closing().unwrap_or(Closing::RequestCap))
            }
        } else {
            Admission::Serve
        };
        if http2 {
            self.streams.fetch_add(1, Ordering::Relaxed);
        }
        let active = ActiveRequest {
            activity: Arc::clone(self),
            http2,
            ended: false,
        };
        (active, admission)
    }

    /// Why the connection is closing for a budget, if it is.
    fn closing(&self) -> Option<Closing> {
        Closing::from_code(self.closing.load(Ordering::Acquire))
    }

    /// Closes the connection for `reason`; `false` when it was already
    /// closing for one.
    fn close_for(&self, reason: Closing) -> bool {
        let first = self
            .closing
            .compare_exchange(0, reason.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            if let Some(metrics) = &self.metrics {
                metrics.closed(reason);
            }
            self.request_close();
        }
        first
    }

    /// The client reset an HTTP/2 stream before its response ended.
    fn client_reset(&self) {
        if self.gone.load(Ordering::Acquire) {
            return;
        }
        if let Some(metrics) = &self.metrics {
            metrics.client_reset();
        }
        let Some(budget) = self.resets else {
            return;
        };
        let (resets, streams) = {
            let now = self.now_ms();
            let streams = self.streams.load(Ordering::Relaxed);
            let mut window = self.reset_window.lock().unwrap_or_else(|e| e.into_inner());
            window.roll(now, budget.window, streams);
            window.resets = window.resets.saturating_add(1);
            (window.resets, streams - window.streams_before)
        };
        // At least half: a client that cancels some of many calls keeps its
        // connection; one whose streams are mostly resets does not.
        if resets >= budget.max
            && u64::from(resets) * 2 >= streams
            && self.close_for(Closing::ClientResets)
        {
            tracing::info!(
                resets,
                streams,
                window = ?budget.window,
                "closing an HTTP/2 connection whose client reset {resets} of its {streams} \
                 latest streams before their response (--max-client-resets)"
            );
        }
    }

    /// Bytes arrived from the client. The watchdog is not woken: the head's
    /// deadline is at least the shortest limit away, and the watchdog never
    /// sleeps longer than that (see [`drive`]).
    fn bytes_read(&self) {
        if self.active.load(Ordering::Acquire) == 0
            && self.head_started.load(Ordering::Relaxed) == NONE
            && !self.http2.load(Ordering::Relaxed)
        {
            self.head_started.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// A write to the client could not proceed (its receive window and our
    /// send buffer are full).
    fn write_blocked(&self) {
        if self.write_blocked.load(Ordering::Relaxed) == NONE {
            self.write_blocked.store(self.now_ms(), Ordering::Relaxed);
            self.signal();
        }
    }

    fn write_progressed(&self) {
        if self.write_blocked.load(Ordering::Relaxed) != NONE {
            self.write_blocked.store(NONE, Ordering::Relaxed);
        }
    }

    fn signal(&self) {
        self.signals.fetch_add(1, Ordering::SeqCst);
        self.watchdog.wake();
    }

    /// When a blocked write to the client must have progressed.
    fn send_deadline(&self, limits: &Limits) -> Option<Instant> {
        let blocked = self.write_blocked.load(Ordering::Relaxed);
        let limit = limits.send?;
        (blocked != NONE).then(|| self.at(blocked) + limit)
    }

    fn request_close(&self) {
        self.close.store(true, Ordering::Relaxed);
        self.signal();
    }

    /// When a connection closed for a timeout must be gone: soon after its
    /// last request ended.
    fn closing_deadline(&self) -> Option<(Instant, &'static str)> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle_since = self.idle_since.load(Ordering::Relaxed);
        Some((self.at(idle_since) + CLOSE_BOUND, "did not close in time"))
    }

    /// When the connection must close if nothing changes, and why; `None`
    /// while a request is in progress (its own timers apply).
    fn deadline(&self, limits: &Limits) -> Option<(Instant, &'static str)> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        if !self.served.load(Ordering::Relaxed) {
            let limit = limits.header_read?;
            return Some((self.start + limit, "no request head in time"));
        }
        let head_started = self.head_started.load(Ordering::Relaxed);
        if head_started != NONE {
            if let Some(limit) = limits.header_read {
                return Some((
                    self.at(head_started) + limit,
                    "request head not finished in time",
                ));
            }
        }
        let limit = limits.keep_alive?;
        let idle_since = self.idle_since.load(Ordering::Relaxed);
        Some((self.at(idle_since) + limit, "idle keep-alive connection"))
    }
}

impl ResetWindow {
    /// Starts a new window when the current one is over (`streams`: the
    /// connection's streams so far).
    fn roll(&mut self, now: u64, window: Duration, streams: u64) {
        let length = u64::try_from(window.as_millis()).unwrap_or(NONE);
        if now.saturating_sub(self.started) >= length {
            *self = Self {
                started: now,
                streams_before: streams,
                resets: 0,
            };
        }
    }
}

/// One request in progress on a connection (see [`Activity::request_started`]).
pub(crate) struct ActiveRequest {
    activity: Arc<Activity>,
    http2: bool,
    /// Its response ended (whole, or with an error not of the client's
    /// making). Dropped before that on HTTP/2, the stream was reset by the
    /// client: hyper drops the service future or the response body then.
    ended: bool,
}

impl fmt::Debug for ActiveRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ActiveRequest")
    }
}

impl ActiveRequest {
    /// Its exchange ended here (a refused stream): not a reset by the client.
    pub(crate) fn finish(&mut self) {
        self.ended = true;
    }
}

impl Drop for ActiveRequest {
    // The watchdog is not woken (as in `Activity::bytes_read`): the idle
    // deadline starts now, so it is at least the shortest limit away.
    fn drop(&mut self) {
        let activity = &self.activity;
        if self.http2 && !self.ended {
            activity.client_reset();
        }
        activity
            .idle_since
            .store(activity.now_ms(), Ordering::Relaxed);
        activity.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request active until it is dropped
/// (sent whole, or abandoned with the connection), and that gives up on a
/// client that takes nothing for the send limit.
///
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
    state: State<B>,
    send: Option<Duration>,
    /// The stall error was returned: the body is over.
    failed: bool,
}

enum State<B> {
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
            state: State::Plain(body, active),
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
            State::Plain(body, active) => note_end_at_drop(body, active),
            State::Watched(stall) => {
                // The body and token go now, not when the timer next wakes.
                if let Some((body, mut active)) = stall.lock().take() {
                    note_end_at_drop(&body, &mut active);
                }
                stall.ended.notify_one();
            }
            State::Moving => {}
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
    B::Error: Into<mcp_id_guard::proxy::BoxError>,
{
    type Data = B::Data;
    type Error = mcp_id_guard::proxy::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let stall = match &mut this.state {
            State::Plain(body, active) => {
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
                let State::Plain(body, active) = std::mem::replace(&mut this.state, State::Moving)
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
                this.state = State::Watched(stall);
                return polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)));
            }
            State::Watched(stall) => stall,
            State::Moving => return Poll::Ready(None),
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
            State::Plain(body, _) => body.is_end_stream(),
            State::Watched(stall) => {
                self.failed
                    || stall
                        .lock()
                        .as_ref()
                        .is_some_and(|(body, _)| body.is_end_stream())
            }
            State::Moving => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Plain(body, _) => body.size_hint(),
            State::Watched(stall) => stall
                .lock()
                .as_ref()
                .map_or_else(SizeHint::default, |(body, _)| body.size_hint()),
            State::Moving => SizeHint::with_exact(0),
        }
    }
}

/// A request body that fails when the client pauses longer than the limit
/// while the proxy waits for it, and then has the connection closed.
pub(crate) struct TimedBody {
    body: hyper::body::Incoming,
    limit: Option<Duration>,
    /// Armed while the reader waits for the client; allocated on first use.
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
    timed_out: bool,
    activity: Arc<Activity>,
}

impl TimedBody {
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

impl Body for TimedBody {
    type Data = Bytes;
    type Error = mcp_id_guard::proxy::BoxError;

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

/// The client socket, telling the watchdog when bytes arrive.
pub(crate) struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl Watched {
    pub(crate) fn new(stream: TcpStream, activity: Arc<Activity>) -> Self {
        Self { stream, activity }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.bytes_read();
        }
        result
    }
}

impl Watched {
    fn wrote(&self, blocked: bool) {
        if blocked {
            self.activity.write_blocked();
        } else {
            self.activity.write_progressed();
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(result.is_pending());
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(result.is_pending());
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Drives `connection` until it ends, closing it when its deadline passes
/// (see [`Limits`]), when a request body timed out, or gracefully when the
/// process shuts down (`shutdown` turns `true`). `graceful` asks the
/// connection to finish its requests in progress and close.
///
/// The watchdog is not woken for each request: a request ending, or the
/// first byte of the next head arriving, can only set a deadline at least
/// the shortest of the header-read and keep-alive limits after it happens,
/// so the watchdog looks again at its deadline or after that shortest limit,
/// whichever comes first, and works out the deadline then. Busy connections
/// thus cost no timer or wake-up per request.
pub(crate) async fn drive<C, E>(
    connection: C,
    graceful: impl Fn(Pin<&mut C>),
    activity: Arc<Activity>,
    limits: Limits,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    peer: std::net::SocketAddr,
) where
    C: Future<Output = Result<(), E>>,
    E: fmt::Display,
{
    let shortest = [limits.header_read, limits.keep_alive]
        .into_iter()
        .flatten()
        .min();
    let mut connection = std::pin::pin!(connection);
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
                tracing::debug!(%peer, "dropping connection: {why}");
                return;
            }
            if closing {
                if activity.active.load(Ordering::Acquire) == 0 {
                    tracing::debug!(%peer, "closing connection: {why}");
                    return;
                }
                // A request arrived meanwhile; let it finish.
                hard_deadline = None;
            } else {
                tracing::debug!(%peer, "closing connection: {why}");
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
                    tracing::debug!(%peer, %error, "connection ended with an error");
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
                        tracing::debug!(%peer, "closing connection: {}", reason.why());
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
    /// The process shuts down.
    Stop,
    /// A request body timed out or a write got blocked.
    Changed,
    /// The time to look again came.
    Timer,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_requests: Option<u64>, resets: Option<u32>) -> Limits {
        Limits {
            header_read: None,
            keep_alive: None,
            body_idle: None,
            send: None,
            max_requests,
            resets: resets.map(|max| ResetBudget {
                max,
                window: Duration::from_secs(60),
            }),
        }
    }

    #[test]
    fn the_cap_th_request_is_the_last_and_later_ones_are_refused() {
        let activity = Activity::new(&limits(Some(3), None), None);
        let admissions: Vec<_> = (0..5).map(|_| activity.request_started(false).1).collect();
        let refused = Admission::Refuse(Closing::RequestCap);
        assert_eq!(
            admissions,
            [
                Admission::Serve,
                Admission::Serve,
                Admission::Last,
                refused,
                refused
            ]
        );
        assert!(activity.close.load(Ordering::Relaxed));
    }

    /// Resets close the connection only once they are the budget and at
    /// least half of the window's streams; finished streams and HTTP/1.1
    /// requests dropped early are no resets.
    #[test]
    fn resets_count_only_when_they_are_half_of_the_streams() {
        let activity = Activity::new(&limits(None, Some(4)), None);
        for _ in 0..3 {
            drop(activity.request_started(false).0);
        }
        let mut streams: Vec<_> = (0..10).map(|_| activity.request_started(true).0).collect();
        for mut finished in streams.drain(..6) {
            finished.finish();
        }
        // 4 resets of 10 streams: under half.
        streams.clear();
        assert_eq!(activity.closing(), None);
        // 5 of 11, then 6 of 12: half.
        drop(activity.request_started(true).0);
        assert_eq!(activity.closing(), None);
        drop(activity.request_started(true).0);
        assert_eq!(activity.closing(), Some(Closing::ClientResets));
        assert_eq!(
            activity.request_started(true).1,
            Admission::Refuse(Closing::ClientResets)
        );
    }
}
