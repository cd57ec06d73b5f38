use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::policy::{refusal, HostPolicy};
use crate::protect::body::ProtectedBody;
use crate::protect::future::ProtectedFuture;

/// Answers requests whose `Host` or `Origin` its [`HostPolicy`] refuses,
/// and passes the others to the inner service. Made by
/// [`HostLayer`](super::HostLayer); see the [module docs](super).
#[derive(Debug, Clone)]
pub struct HostCheck<S> {
    inner: S,
    policy: Arc<HostPolicy>,
}

impl<S> HostCheck<S> {
    pub(super) fn new(inner: S, policy: Arc<HostPolicy>) -> Self {
        Self { inner, policy }
    }

    /// The policy it applies.
    pub fn policy(&self) -> &HostPolicy {
        &self.policy
    }

    inner_accessors!();
}

impl<S, B, ResBody> Service<Request<B>> for HostCheck<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<ProtectedBody<ResBody>>;
    type Error = S::Error;
    type Future = ProtectedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Checked before anything reads the body: a rebound page's request
        // never reaches the server.
        match self.policy.check(&request) {
            Ok(()) => ProtectedFuture::called(self.inner.call(request)),
            Err(kind) => ProtectedFuture::refused(kind, refusal(kind)),
        }
    }
}
