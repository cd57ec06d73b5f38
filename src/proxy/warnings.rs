//! Upstream failure warnings at a bounded rate: an upstream that is down
//! fails every request, and a line per request would flood the log.

use super::UpstreamFailure;
use crate::throttle::Throttle;

/// Upstream failure warnings, one kind per [`UpstreamFailure`].
#[derive(Debug, Default)]
pub(crate) struct Warnings(Throttle<{ UpstreamFailure::ALL.len() }>);

impl Warnings {
    /// `Some(failures not logged since the last line)` when a line about
    /// `kind` may be written now.
    pub(crate) fn ready(&self, kind: UpstreamFailure) -> Option<u64> {
        let index = UpstreamFailure::ALL
            .iter()
            .position(|known| *known == kind)
            .unwrap_or(0);
        self.0.ready(index)
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
    }
}
