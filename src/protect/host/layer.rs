use std::sync::Arc;

use tower_layer::Layer;

use super::policy::HostPolicy;
use super::service::HostCheck;

/// Applies a [`HostPolicy`] to every request: wraps a service in
/// [`HostCheck`]. See the [module docs](super).
#[derive(Debug, Clone, Default)]
pub struct HostLayer {
    policy: Arc<HostPolicy>,
}

impl HostLayer {
    /// The layer with `policy`. [`HostLayer::default`] is
    /// [`HostPolicy::loopback`].
    pub fn new(policy: HostPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
        }
    }

    /// The policy it applies.
    pub fn policy(&self) -> &HostPolicy {
        &self.policy
    }
}

impl<S> Layer<S> for HostLayer {
    type Service = HostCheck<S>;

    fn layer(&self, inner: S) -> Self::Service {
        // One policy for every service the layer makes: axum clones the
        // service per request, which then costs a reference count.
        HostCheck::new(inner, Arc::clone(&self.policy))
    }
}
