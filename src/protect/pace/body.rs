use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;
use tokio::time::{Instant, Sleep};

use crate::protect::refused::Refused;

/// The error type of [`PacedBody`]: the inner body's error, boxed, or a
/// [`PaceError`].
type PacedError = Box<dyn std::error::Error + Send + Sync>;

/// The settings of a [`BodyPaceLayer`](super::BodyPaceLayer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pace {
    /// The longest pause; `None`: no limit.
    pub(super) idle_timeout: Option<Duration>,
    /// Bytes per second; 0: no minimum.
    pub(super) min_rate: u64,
    /// How long a body may wait before the minimum rate applies.
    pub(super) grace: Duration,
}

impl Pace {
    /// Whether there is anything to watch.
    pub(super) fn is_on(&self) -> bool {
        self.idle_timeout.is_some() || self.min_rate > 0
    }

    /// The most waiting a body may have in hand: one idle timeout (or,
    /// without one, one grace period). Data earns waiting at the minimum
    /// rate, up to this: a burst of megabytes earns no hours of pauses.
    fn max_credit(&self) -> Duration {
        self.idle_timeout.unwrap_or(self.grace).max(self.grace)
    }

    /// The credit after a pause of `waited` and `bytes` of data.
    fn credit_after(&self, credit: Duration, waited: Duration, bytes: u64) -> Duration {
        if self.min_rate == 0 {
            return credit;
        }
        credit
            .saturating_sub(waited)
            .saturating_add(transfer_time(bytes, self.min_rate))
            .min(self.max_credit())
    }

    /// When a wait that started at `since` trips, and as which kind, if no
    /// data arrives by then: a body with `credit` of waiting in hand.
    fn deadline(&self, since: Instant, credit: Duration) -> Option<(Instant, Refused)> {
        let idle = self
            .idle_timeout
            .and_then(|limit| since.checked_add(limit))
            .map(|at| (at, Refused::BodyIdle));
        let slow = (self.min_rate > 0)
            .then(|| since.checked_add(credit))
            .flatten()
            .map(|at| (at, Refused::BodySlow));
        match (idle, slow) {
            (Some(idle), Some(slow)) => Some(if idle.0 <= slow.0 { idle } else { slow }),
            (idle, slow) => idle.or(slow),
        }
    }
}

/// How long `bytes` take at `rate` bytes per second.
fn transfer_time(bytes: u64, rate: u64) -> Duration {
    let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(rate);
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    // Below 10^9, so it fits.
    let subsec = (nanos % 1_000_000_000) as u32;
    Duration::new(secs, subsec)
}

/// Whether, and how, a body broke its pace: shared by the body and the
/// response future, so that the future answers `408` itself.
#[derive(Debug, Default)]
pub(super) struct Trip(AtomicU8);

impl Trip {
    const IDLE: u8 = 1;
    const SLOW: u8 = 2;

    fn set(&self, kind: Refused) {
        let value = if kind == Refused::BodyIdle {
            Self::IDLE
        } else {
            Self::SLOW
        };
        // Release: the body's error reaches the inner service, whose answer
        // reaches the future; the future then reads the flag (Acquire).
        self.0.store(value, Ordering::Release);
    }

    pub(super) fn get(&self) -> Option<Refused> {
        match self.0.load(Ordering::Acquire) {
            Self::IDLE => Some(Refused::BodyIdle),
            Self::SLOW => Some(Refused::BodySlow),
            _ => None,
        }
    }
}

/// Why a [`PacedBody`] failed: the client paused too long, or sent too
/// slowly. The inner service sees it as the body's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceError {
    kind: Refused,
    pace: Pace,
}

impl PaceError {
    /// [`Refused::BodyIdle`] or [`Refused::BodySlow`].
    pub fn kind(&self) -> Refused {
        self.kind
    }
}

impl fmt::Display for PaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.pace.idle_timeout) {
            (Refused::BodyIdle, Some(limit)) => {
                write!(f, "the client sent no request body data for {limit:?}")
            }
            _ => write!(
                f,
                "the request body arrived slower than {} bytes per second",
                self.pace.min_rate
            ),
        }
    }
}

impl std::error::Error for PaceError {}

/// A request body held to a pace: see the [module docs](super). Yields a
/// [`PaceError`] (boxed) when the client pauses longer than the idle timeout
/// or sends slower than the minimum rate, and nothing after it.
#[pin_project]
#[derive(Debug)]
pub struct PacedBody<B> {
    #[pin]
    body: B,
    pace: Pace,
    /// `None` for a body that is not watched (complete, or the layer off).
    trip: Option<Arc<Trip>>,
    /// Data bytes received so far.
    received: u64,
    /// How much longer the reader may wait for the client under the
    /// minimum rate: the grace period at first, then what the data earned
    /// at the minimum rate less the waits, never more than
    /// [`Pace::max_credit`].
    credit: Duration,
    /// When the current pause started; `None` while data flows.
    since: Option<Instant>,
    /// Made at the first pause and reset after: one timer per body.
    timer: Option<Pin<Box<Sleep>>>,
    /// Where the timer is set.
    armed: Option<Instant>,
    tripped: bool,
}

impl<B> PacedBody<B> {
    pub(super) fn new(body: B, pace: Pace, trip: Option<Arc<Trip>>) -> Self {
        Self {
            body,
            pace,
            trip,
            received: 0,
            credit: pace.grace,
            since: None,
            timer: None,
            armed: None,
            tripped: false,
        }
    }
}

impl<B> Body for PacedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<PacedError>,
{
    type Data = Bytes;
    type Error = PacedError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, PacedError>>> {
        let this = self.project();
        if *this.tripped {
            return Poll::Ready(None);
        }
        let polled = this.body.poll_frame(cx);
        let Some(trip) = this.trip else {
            return polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)));
        };
        let Poll::Pending = polled else {
            let waited = this
                .since
                .take()
                .map_or(Duration::ZERO, |since| since.elapsed());
            let bytes = match &polled {
                Poll::Ready(Some(Ok(frame))) => frame.data_ref().map_or(0, Bytes::len) as u64,
                _ => 0,
            };
            *this.received = this.received.saturating_add(bytes);
            *this.credit = this.pace.credit_after(*this.credit, waited, bytes);
            return polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)));
        };
        // Only the time the reader waits for the client counts (as Kestrel
        // counts it): a reader slowed by what it feeds is not the client's
        // fault, and data that waited in the socket meanwhile arrives at
        // once.
        let since = *this.since.get_or_insert_with(Instant::now);
        let Some((deadline, kind)) = this.pace.deadline(since, *this.credit) else {
            return Poll::Pending;
        };
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if *this.armed != Some(deadline) {
            timer.as_mut().reset(deadline);
            *this.armed = Some(deadline);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        *this.tripped = true;
        trip.set(kind);
        let error = PaceError {
            kind,
            pace: *this.pace,
        };
        tracing::debug!(received = *this.received, "request body cut: {error}");
        Poll::Ready(Some(Err(Box::new(error))))
    }

    fn is_end_stream(&self) -> bool {
        self.tripped || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACE: Pace = Pace {
        idle_timeout: Some(Duration::from_secs(30)),
        min_rate: 240,
        grace: Duration::from_secs(5),
    };

    #[test]
    fn transfer_times() {
        assert_eq!(transfer_time(240, 240), Duration::from_secs(1));
        assert_eq!(transfer_time(1, 4), Duration::from_millis(250));
        assert_eq!(transfer_time(u64::MAX, 1), Duration::from_secs(u64::MAX));
    }

    #[tokio::test]
    async fn the_earlier_limit_sets_the_deadline() {
        let since = Instant::now();
        let grace = Duration::from_secs(5);
        // Nothing received: the grace period ends first.
        assert_eq!(
            PACE.deadline(since, grace),
            Some((since + grace, Refused::BodySlow))
        );
        // 2400 bytes earn 10 s of waiting; 4 s already spent.
        let credit = PACE.credit_after(grace, Duration::from_secs(4), 2400);
        assert_eq!(credit, Duration::from_secs(11));
        assert_eq!(
            PACE.deadline(since, credit),
            Some((since + credit, Refused::BodySlow))
        );
        // 24 000 bytes earn 100 s, but a body holds at most one idle
        // timeout (30 s): the idle timeout comes first.
        let credit = PACE.credit_after(grace, Duration::ZERO, 24_000);
        assert_eq!(credit, Duration::from_secs(30));
        assert_eq!(
            PACE.deadline(since, credit),
            Some((since + Duration::from_secs(30), Refused::BodyIdle))
        );
        // 4 MiB at once, then 20 s pauses of one byte each: each pause
        // spends 20 s and the byte earns 1/240 s.
        let mut credit = PACE.credit_after(grace, Duration::ZERO, 4 << 20);
        credit = PACE.credit_after(credit, Duration::from_secs(20), 1);
        assert!(credit < Duration::from_secs(11), "{credit:?}");
        // Over the budget already: only what the last data earned is left.
        let credit = PACE.credit_after(grace, Duration::from_secs(20), 240);
        assert_eq!(
            PACE.deadline(since, credit),
            Some((since + Duration::from_secs(1), Refused::BodySlow))
        );
        let off = Pace {
            idle_timeout: None,
            min_rate: 0,
            grace: Duration::ZERO,
        };
        assert_eq!(off.deadline(since, Duration::ZERO), None);
    }

    /// Issue 30, item 1: a body that sends a burst and then trickles (a byte
    /// each 50 ms, under the idle timeout) is cut once its pauses have used
    /// up one idle timeout of credit; the burst does not buy hours (100 000
    /// bytes at 240 B/s earned 416 s).
    #[tokio::test]
    async fn a_burst_earns_no_more_than_one_window() {
        use futures::StreamExt as _;
        use http_body_util::{BodyExt as _, StreamBody};

        let pace = Pace {
            idle_timeout: Some(Duration::from_millis(400)),
            min_rate: 240,
            grace: Duration::from_millis(300),
        };
        let (send, frames) = futures::channel::mpsc::unbounded::<Bytes>();
        let body = StreamBody::new(frames.map(|bytes| Ok::<_, PacedError>(Frame::data(bytes))));
        let trip = Arc::new(Trip::default());
        let mut paced = PacedBody::new(body, pace, Some(Arc::clone(&trip)));
        send.unbounded_send(Bytes::from(vec![b'x'; 100_000]))
            .unwrap();
        // The client: a byte every 50 ms after the burst, for as long as the
        // body is read.
        let trickle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if send.unbounded_send(Bytes::from_static(b"x")).is_err() {
                    return;
                }
            }
        });
        let started = std::time::Instant::now();
        let cut = tokio::time::timeout(Duration::from_secs(3), async {
            while let Some(frame) = paced.frame().await {
                if let Err(error) = frame {
                    return error;
                }
            }
            unreachable!("the body never ends")
        })
        .await
        .expect("the trickle was never cut");
        trickle.abort();
        let error = cut.downcast::<PaceError>().unwrap();
        assert_eq!(error.kind(), Refused::BodySlow);
        assert_eq!(trip.get(), Some(Refused::BodySlow));
        // One grace period of pauses, and the little the trickle adds.
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn trips_are_shared() {
        let trip = Trip::default();
        assert_eq!(trip.get(), None);
        trip.set(Refused::BodySlow);
        assert_eq!(trip.get(), Some(Refused::BodySlow));
    }
}
