//! Limits derived from the process's file-descriptor budget, and warnings
//! that repeat at a bounded rate.

use std::time::{Duration, Instant};

/// Descriptors kept for everything that is not a client or upstream
/// connection: the listeners, the admin connections (at most 16), stdio,
/// the runtime's own.
const RESERVED_DESCRIPTORS: u64 = 32;

/// The budget when the limit is unlimited or cannot be read.
const FALLBACK_DESCRIPTORS: u64 = 1 << 20;

/// The largest derived connection cap, whatever the limit says (some
/// systems report limits near 2^63).
const MAX_DERIVED_CONNECTIONS: u64 = 1 << 20;

/// The soft `RLIMIT_NOFILE`: how many descriptors this process may open.
pub(crate) fn descriptor_limit() -> u64 {
    #[cfg(unix)]
    {
        use rustix::process::{getrlimit, Resource};
        getrlimit(Resource::Nofile)
            .current
            .unwrap_or(FALLBACK_DESCRIPTORS)
    }
    #[cfg(not(unix))]
    {
        FALLBACK_DESCRIPTORS
    }
}

/// Half of the descriptors left after the reserve: each client connection
/// may need an upstream connection beside it, so client and upstream
/// connections together stay within the limit and `accept` does not fail
/// with "too many open files".
pub(crate) fn connections_for(descriptors: u64) -> usize {
    let half = descriptors.saturating_sub(RESERVED_DESCRIPTORS) / 2;
    usize::try_from(half.clamp(1, MAX_DERIVED_CONNECTIONS)).unwrap_or(1 << 20)
}

/// Lets one warning of a kind through per interval and counts the rest, so
/// a storm (accept failures, a full connection table) costs a line every
/// few seconds, not a line per event.
#[derive(Debug)]
pub(crate) struct Every {
    interval: Duration,
    next: Option<Instant>,
    suppressed: u64,
}

impl Every {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            next: None,
            suppressed: 0,
        }
    }

    /// `Some(how many were suppressed since the last line)` when a line may
    /// be written now.
    pub(crate) fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.next.is_some_and(|next| now < next) {
            self.suppressed += 1;
            return None;
        }
        self.next = Some(now + self.interval);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_budget() {
        assert_eq!(connections_for(1024), 496);
        assert_eq!(connections_for(64), 16);
        assert_eq!(connections_for(10), 1);
        assert_eq!(connections_for(u64::MAX), 1 << 20);
        assert!(descriptor_limit() > 0);
    }

    #[test]
    fn one_line_per_interval() {
        let mut every = Every::new(Duration::from_secs(3600));
        assert_eq!(every.ready(), Some(0));
        for _ in 0..5 {
            assert_eq!(every.ready(), None);
        }
        every.next = Some(Instant::now());
        assert_eq!(every.ready(), Some(5));
    }
}
