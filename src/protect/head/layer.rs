use tower_layer::Layer;

use super::service::HeadLimit;

/// Refuses requests whose head is larger than a limit: wraps a service in
/// [`HeadLimit`]. See the [module docs](super).
#[derive(Debug, Clone, Copy)]
pub struct HeadLimitLayer {
    max_bytes: usize,
}

impl HeadLimitLayer {
    /// Refuses heads (request line and headers, as HTTP/1.1 sends them) of
    /// more than `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self { max_bytes }
    }

    /// The limit, in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}

impl<S> Layer<S> for HeadLimitLayer {
    type Service = HeadLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HeadLimit::new(inner, self.max_bytes)
    }
}
