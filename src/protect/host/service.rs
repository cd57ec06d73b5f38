use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;

use super::policy::{refusal, HostPolicy};
use crate::protect::refused::Refused;

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

impl<S> HostCheck<S> {
    /// `421` or `403` for what the policy refuses. Checked before anything
    /// reads the body: a rebound page's request never reaches the server.
    fn refusal<B>(&self, request: &Request<B>) -> Option<(Refused, Response<Full<Bytes>>)> {
        self.policy
            .check(request)
            .err()
            .map(|kind| (kind, refusal(kind)))
    }
}

head_check_service!(HostCheck);
