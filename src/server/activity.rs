//! What the watchdog knows about one connection: its requests, whether bytes
//! arrived, whether a write is blocked, and its request and reset budgets.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use tokio::time::Instant;

use super::{Limits, ResetBudget};
use crate::protect::metrics::Metrics;
use crate::throttle::Shared;

/// "No time recorded".
pub(super) const NONE: u64 = u64::MAX;

/// How long a connection that was told to close may take to do so before it
/// is dropped (when no request is in progress on it).
pub(super) const CLOSE_BOUND: Duration = Duration::from_millis(100);

/// Why the server closes a connection that its client would keep open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closing {
    /// The connection carried its --max-requests-per-connection.
    RequestCap,
    /// Its client reset too many streams (--max-client-resets).
    ClientResets,
    /// It was idle while a new connection waited at the connection cap
    /// (see [`Activity::make_room`]).
    Room,
}

impl Closing {
    const fn code(self) -> u8 {
        match self {
            Self::RequestCap => 1,
            Self::ClientResets => 2,
            Self::Room => 3,
        }
    }

    const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::RequestCap),
            2 => Some(Self::ClientResets),
            3 => Some(Self::Room),
            _ => None,
        }
    }

    /// The label of `mcp_id_guard_connections_closed_total`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::RequestCap => "request_cap",
            Self::ClientResets => "client_resets",
            Self::Room => "idle_at_capacity",
        }
    }

    /// The reason in the `503` of a request that arrives after the close.
    pub(super) const fn refusal(self) -> &'static str {
        match self {
            Self::RequestCap => "this connection has carried its last request",
            Self::ClientResets => "this connection reset too many requests",
            // Never sent: a request that races with the close is served
            // (see `Activity::request_started`).
            Self::Room => "this connection was closed to make room for another",
        }
    }

    pub(super) fn why(self) -> &'static str {
        match self {
            Self::RequestCap => "it carried its last request (--max-requests-per-connection)",
            Self::ClientResets => {
                "its client reset too many streams before their response (--max-client-resets)"
            }
            Self::Room => "it was idle while a new connection waited at the connection cap",
        }
    }
}

/// What a request that has just arrived may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allowance {
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
    pub(super) active: AtomicUsize,
    /// Since when no request has been active (ms since `start`).
    idle_since: AtomicU64,
    /// When the first byte arrived while idle (ms since `start`), or `NONE`.
    head_started: AtomicU64,
    /// Whether a request has arrived (protocol detection is over).
    served: AtomicBool,
    /// Whether the last read of the socket found nothing to read: hyper
    /// waits for the client. `false` while hyper may still hold bytes it
    /// read (pipelined requests it answers one after the other, with no
    /// request active in between).
    read_waiting: AtomicBool,
    /// Whether the connection speaks HTTP/2, where bytes arrive while idle
    /// (pings, settings) and do not start a request head.
    http2: AtomicBool,
    /// Since when a write to the client has been blocked (ms since
    /// `start`), or `NONE`.
    write_blocked: AtomicU64,
    /// A request body timed out, or a [`Closing`] budget ran out: close the
    /// connection.
    pub(super) close: AtomicBool,
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
    pub(super) gone: AtomicBool,
    metrics: Option<Metrics>,
    /// How many times the watchdog was woken: the connection must close
    /// early (a request body timed out) or a write to the client got
    /// blocked. Counted before each wake-up, so the watchdog, which reads
    /// the count after registering its waker, misses none, and registers
    /// again only after one (or when its waker changes).
    pub(super) signals: AtomicU64,
    pub(super) watchdog: AtomicWaker,
}

impl Activity {
    pub(crate) fn new(limits: &Limits, metrics: Option<Metrics>) -> Arc<Self> {
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
            read_waiting: AtomicBool::new(false),
            http2: AtomicBool::new(false),
            close: AtomicBool::new(false),
            signals: AtomicU64::new(0),
            watchdog: AtomicWaker::new(),
        })
    }

    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    pub(super) fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    /// A request has arrived; it is active until the returned token (moved
    /// into its response body) is dropped. The admission says whether it may
    /// go to the upstream.
    pub(crate) fn request_started(self: &Arc<Self>, http2: bool) -> (ActiveRequest, Allowance) {
        self.served.store(true, Ordering::Relaxed);
        if http2 {
            self.http2.store(true, Ordering::Relaxed);
        }
        self.active.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(NONE, Ordering::Relaxed);
        let count = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let admission = if let Some(closing) = self.closing() {
            // A request that arrived as an idle connection was told to make
            // room had already left its client: it is served, as the
            // connection's last, rather than refused with a 503 that the
            // client did nothing to earn.
            if closing == Closing::Room {
                Allowance::Last
            } else {
                Allowance::Refuse(closing)
            }
        } else if self.max_requests.is_some_and(|max| count >= max) {
            if self.close_for(Closing::RequestCap) {
                Allowance::Last
            } else {
                Allowance::Refuse(self.closing().unwrap_or(Closing::RequestCap))
            }
        } else {
            Allowance::Serve
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
    pub(super) fn closing(&self) -> Option<Closing> {
        Closing::from_code(self.closing.load(Ordering::Acquire))
    }

    /// Closes the connection for `reason`; `false` when it was already
    /// closing for one.
    pub(super) fn close_for(&self, reason: Closing) -> bool {
        let first = self
            .closing
            .compare_exchange(0, reason.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            if let Some(metrics) = &self.metrics {
                metrics.closed(reason.as_str());
            }
            self.request_close();
        }
        first
    }

    /// Since when the connection has been idle, if it is: no request in
    /// progress, hyper waiting for the client to send (not answering
    /// pipelined requests it already read), no byte of a next request head
    /// (or of the first one, or of the HTTP/2 preface) arrived, no write to
    /// the client blocked, and not already closing. Such a connection can
    /// close without losing anything its client sent or was sent: a
    /// blocked write may be the end of a response that hyper still holds
    /// (its request no longer counts as active), which a close would cut;
    /// a client that reads nothing is the send timeout's.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        let idle = !self.gone.load(Ordering::Acquire)
            && self.active.load(Ordering::Acquire) == 0
            && self.read_waiting.load(Ordering::Relaxed)
            && self.head_started.load(Ordering::Relaxed) == NONE
            && self.write_blocked.load(Ordering::Relaxed) == NONE
            && self.closing.load(Ordering::Acquire) == 0
            && !self.close.load(Ordering::Relaxed);
        idle.then(|| self.at(self.idle_since.load(Ordering::Relaxed)))
    }

    /// Closes the connection, gracefully, for a new one waiting at the
    /// connection cap (as nginx closes idle keep-alive connections when it
    /// runs out): `false` when it is no longer idle or was already closing.
    /// A request that arrives meanwhile is still served, as its last.
    pub(super) fn make_room(&self) -> bool {
        self.idle_since().is_some() && self.close_for(Closing::Room)
    }

    /// Whether a connection told to [make room](Self::make_room) is about
    /// to free its slot (or, ended, to hand back its permit): it is not,
    /// when a request raced with the close and is being served, and the
    /// room has to come from elsewhere.
    pub(super) fn leaving(&self) -> bool {
        self.active.load(Ordering::Acquire) == 0
    }

    /// The connection has ended (its watchdog let go of it).
    pub(super) fn ended(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// The client reset an HTTP/2 stream before its response ended.
    pub(super) fn client_reset(&self) {
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
            let Some(suppressed) = Shared::ClientResets.due() else {
                return;
            };
            tracing::info!(
                suppressed,
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
    pub(super) fn bytes_read(&self) {
        if self.read_waiting.load(Ordering::Relaxed) {
            self.read_waiting.store(false, Ordering::Relaxed);
        }
        if self.active.load(Ordering::Acquire) == 0
            && self.head_started.load(Ordering::Relaxed) == NONE
            && !self.http2.load(Ordering::Relaxed)
        {
            self.head_started.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// A read of the socket found nothing: whatever hyper read before, it
    /// has taken in.
    pub(super) fn read_waiting(&self) {
        if !self.read_waiting.load(Ordering::Relaxed) {
            self.read_waiting.store(true, Ordering::Relaxed);
        }
    }

    /// A write to the client could not proceed (its receive window and our
    /// send buffer are full).
    pub(super) fn write_blocked(&self) {
        if self.write_blocked.load(Ordering::Relaxed) == NONE {
            self.write_blocked.store(self.now_ms(), Ordering::Relaxed);
            self.signal();
        }
    }

    pub(super) fn write_progressed(&self) {
        if self.write_blocked.load(Ordering::Relaxed) != NONE {
            self.write_blocked.store(NONE, Ordering::Relaxed);
        }
    }

    pub(super) fn signal(&self) {
        self.signals.fetch_add(1, Ordering::SeqCst);
        self.watchdog.wake();
    }

    /// When a blocked write to the client must have progressed.
    pub(super) fn send_deadline(&self, limits: &Limits) -> Option<Instant> {
        let blocked = self.write_blocked.load(Ordering::Relaxed);
        let limit = limits.send?;
        (blocked != NONE).then(|| self.at(blocked) + limit)
    }

    pub(super) fn request_close(&self) {
        self.close.store(true, Ordering::Relaxed);
        self.signal();
    }

    /// When a connection closed for a timeout must be gone: soon after its
    /// last request ended.
    pub(super) fn closing_deadline(&self) -> Option<(Instant, &'static str)> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle_since = self.idle_since.load(Ordering::Relaxed);
        Some((self.at(idle_since) + CLOSE_BOUND, "did not close in time"))
    }

    /// When the connection must close if nothing changes, and why; `None`
    /// while a request is in progress (its own timers apply).
    pub(super) fn deadline(&self, limits: &Limits) -> Option<(Instant, &'static str)> {
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
    pub(super) activity: Arc<Activity>,
    pub(super) http2: bool,
    /// Its response ended (whole, or with an error not of the client's
    /// making). Dropped before that on HTTP/2, the stream was reset by the
    /// client: hyper drops the service future or the response body then.
    pub(super) ended: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_requests: Option<u64>, resets: Option<u32>) -> Limits {
        Limits {
            header_read: None,
            keep_alive: None,
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
        let refused = Allowance::Refuse(Closing::RequestCap);
        assert_eq!(
            admissions,
            [
                Allowance::Serve,
                Allowance::Serve,
                Allowance::Last,
                refused,
                refused
            ]
        );
        assert!(activity.close.load(Ordering::Relaxed));
    }

    /// Only a connection with no request in progress and no byte of a next
    /// head makes room; one that does keeps serving what arrives after it
    /// was told to, as its last request.
    #[tokio::test]
    async fn only_idle_connections_make_room() {
        let fresh = Activity::new(&limits(None, None), None);
        assert!(fresh.idle_since().is_none(), "not read from yet");
        fresh.read_waiting();
        assert!(fresh.idle_since().is_some(), "a connection yet to speak");
        let busy = Activity::new(&limits(None, None), None);
        let (request, _) = busy.request_started(false);
        busy.read_waiting();
        assert!(!busy.make_room());
        // Pipelined requests arrive during the first one.
        busy.bytes_read();
        drop(request);
        assert!(!busy.make_room(), "pipelined requests may be buffered");
        busy.read_waiting();
        assert!(busy.make_room(), "control: idle now");
        let busy = Activity::new(&limits(None, None), None);
        drop(busy.request_started(false).0);
        busy.read_waiting();
        busy.write_blocked();
        assert!(!busy.make_room(), "its answer is not all sent");
        busy.write_progressed();
        busy.bytes_read();
        assert!(!busy.make_room(), "a next head has started");

        let idle = Activity::new(&limits(None, None), None);
        drop(idle.request_started(false).0);
        idle.read_waiting();
        assert!(idle.make_room());
        assert!(!idle.make_room(), "already closing");
        assert!(idle.leaving());
        assert_eq!(idle.closing(), Some(Closing::Room));
        let (_raced, admission) = idle.request_started(false);
        assert_eq!(admission, Allowance::Last);
        assert!(!idle.leaving());
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
            Allowance::Refuse(Closing::ClientResets)
        );
    }
}
