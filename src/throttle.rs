//! Log lines at a bounded rate: wherever a hostile client or a dead
//! upstream could otherwise make the process write a line per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// At most one line per kind per interval.
const INTERVAL: Duration = Duration::from_secs(10);

/// One log line per kind per interval, with a count of what was not logged
/// in between: what the proxy uses wherever a hostile client or a dead
/// upstream could otherwise make it write a line per request.
#[derive(Debug)]
pub(crate) struct Throttle<const KINDS: usize> {
    start: Instant,
    /// Per kind: when the next line may be written (ms since `start`).
    next_ms: [AtomicU64; KINDS],
    /// Per kind: events not logged since the last line.
    suppressed: [AtomicU64; KINDS],
}

impl<const KINDS: usize> Default for Throttle<KINDS> {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            next_ms: std::array::from_fn(|_| AtomicU64::new(0)),
            suppressed: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl<const KINDS: usize> Throttle<KINDS> {
    /// `Some(events not logged since the last line)` when a line about kind
    /// `index` may be written now; else counts the event and says `None`.
    pub(crate) fn ready(&self, index: usize) -> Option<u64> {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms[index].load(Ordering::Relaxed);
        let interval = u64::try_from(INTERVAL.as_millis()).unwrap_or(u64::MAX);
        let claimed = now >= next
            && self.next_ms[index]
                .compare_exchange(
                    next,
                    now.saturating_add(interval),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if claimed {
            Some(self.suppressed[index].swap(0, Ordering::Relaxed))
        } else {
            self.suppressed[index].fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// One throttle per process for lines written where no shared state is at
/// hand (a response body, a connection's bookkeeping), each kind with its
/// own index in [`Shared`].
pub(crate) fn shared() -> &'static Throttle<{ Shared::ALL.len() }> {
    static SHARED: std::sync::OnceLock<Throttle<{ Shared::ALL.len() }>> =
        std::sync::OnceLock::new();
    SHARED.get_or_init(Throttle::default)
}

/// The kinds of line the process-wide throttle counts.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // each kind is written under some features only
pub(crate) enum Shared {
    /// An upstream response body broke off.
    UpstreamBodyBroke,
    /// An upstream response body sent nothing in time.
    UpstreamBodyIdle,
    /// An HTTP/2 connection closed for its client's resets.
    ClientResets,
}

impl Shared {
    const ALL: [Shared; 3] = [
        Shared::UpstreamBodyBroke,
        Shared::UpstreamBodyIdle,
        Shared::ClientResets,
    ];

    /// `Some(lines not written since the last one)` when a line of this
    /// kind may be written now.
    #[allow(dead_code)]
    pub(crate) fn due(self) -> Option<u64> {
        shared().ready(self as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_interval_and_a_count_of_the_rest() {
        let throttle = Throttle::<2>::default();
        assert_eq!(throttle.ready(0), Some(0));
        assert_eq!(throttle.ready(0), None);
        assert_eq!(throttle.ready(0), None);
        assert_eq!(throttle.ready(1), Some(0));
        throttle.next_ms[0].store(0, Ordering::Relaxed);
        assert_eq!(throttle.ready(0), Some(2));
    }
}
