use std::time::Duration;

use tower_layer::Layer;

use super::body::Pace;
use super::service::BodyPace;

/// The longest pause in a request body by default.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The minimum data rate by default, in bytes per second: Kestrel's.
const DEFAULT_MIN_RATE: u64 = 240;
/// How long a body may wait before the minimum rate applies, by default:
/// Kestrel's.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// Holds request bodies to a pace: wraps a service in [`BodyPace`]. See the
/// [module docs](super).
#[derive(Debug, Clone, Copy)]
pub struct BodyPaceLayer {
    pace: Pace,
}

impl Default for BodyPaceLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl BodyPaceLayer {
    /// Pauses of at most 30 s, and at least 240 bytes per second after a
    /// grace period of 5 s.
    pub fn new() -> Self {
        Self {
            pace: Pace {
                idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
                min_rate: DEFAULT_MIN_RATE,
                grace: DEFAULT_GRACE,
            },
        }
    }

    /// The longest the reader may wait for the next piece of the body
    /// (30 s). `None` (or zero) turns the limit off.
    pub fn idle_timeout(mut self, limit: Option<Duration>) -> Self {
        self.pace.idle_timeout = limit.filter(|limit| !limit.is_zero());
        self
    }

    /// The lowest rate, in bytes per second, at which the body must arrive
    /// once the grace period is over (240), judged over a window of one
    /// idle timeout: data earns waiting at this rate, but never more than
    /// the idle timeout's worth (see the [module docs](super)). `0` turns
    /// it off.
    pub fn min_rate(mut self, bytes_per_sec: u64) -> Self {
        self.pace.min_rate = bytes_per_sec;
        self
    }

    /// How long the reader may wait for the body before the minimum rate
    /// applies (5 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.pace.grace = grace;
        self
    }
}

impl<S> Layer<S> for BodyPaceLayer {
    type Service = BodyPace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyPace::new(inner, self.pace)
    }
}
