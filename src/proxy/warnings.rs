//! Upstream failure warnings at a bounded rate: an upstream that is down
//! fails every request, and a line per request would flood the log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::UpstreamFailure;

/// At most one line per kind per interval.
const INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(crate) struct Warnings {
    start: Instant,
    /// Per kind: when the next line may be written (ms since `start`).
    next_ms: [AtomicU64; UpstreamFailure::ALL.len()],
    /// Per kind: failures not logged since the last line.
    suppressed: [AtomicU64; UpstreamFailure::ALL.len()],
}

impl Default for Warnings {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            next_ms: Default::default(),
            suppressed: Default::default(),
        }
    }
}

impl Warnings {
    /// `Some(failures not logged since the last line)` when a line about
    /// `kind` may be written now.
    pub(crate) fn ready(&self, kind: UpstreamFailure) -> Option<u64> {
        let index = UpstreamFailure::ALL
            .iter()
            .position(|known| *known == kind)
            .unwrap_or(0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_interval() {
        let warnings = Warnings::default();
        assert_eq!(warnings.ready(UpstreamFailure::Unreachable), Some(0));
        assert_eq!(warnings.ready(UpstreamFailure::Unreachable), None);
        assert_eq!(warnings.ready(UpstreamFailure::Unreachable), None);
        assert_eq!(warnings.ready(UpstreamFailure::Busy), Some(0));
        warnings.next_ms[0].store(0, Ordering::Relaxed);
        assert_eq!(warnings.ready(UpstreamFailure::Unreachable), Some(2));
    }
}
