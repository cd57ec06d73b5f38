//! [`ProtectedFuture`]: the response future of the layers that decide on the
//! request head alone ([`HostCheck`](super::HostCheck),
//! [`HeadLimit`](super::HeadLimit)).

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use pin_project::pin_project;

use super::body::ProtectedBody;
use super::refused::{refusal, Refused};

/// The inner service's response future, or the layer's refusal, ready at
/// once.
#[pin_project]
#[derive(Debug)]
pub struct ProtectedFuture<F> {
    #[pin]
    outcome: Outcome<F>,
}

#[pin_project(project = OutcomeProj)]
#[derive(Debug)]
enum Outcome<F> {
    Called {
        #[pin]
        future: F,
    },
    Refused {
        kind: Refused,
        /// Taken when the future resolves.
        answer: Option<Response<Full<Bytes>>>,
    },
}

impl<F> ProtectedFuture<F> {
    /// The request went to the inner service.
    pub(crate) fn called(future: F) -> Self {
        Self {
            outcome: Outcome::Called { future },
        }
    }

    /// The layer refused the request with `answer`.
    pub(crate) fn refused(kind: Refused, answer: Response<Full<Bytes>>) -> Self {
        Self {
            outcome: Outcome::Refused {
                kind,
                answer: Some(answer),
            },
        }
    }
}

impl<F, B, E> Future for ProtectedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ProtectedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().outcome.project() {
            OutcomeProj::Called { future } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(response.map(ProtectedBody::inner)))
            }
            OutcomeProj::Refused { kind, answer } => {
                let answer = answer
                    .take()
                    .expect("ProtectedFuture polled after it completed");
                Poll::Ready(Ok(refusal(*kind, answer)))
            }
        }
    }
}

/// The `Service` impl of a layer that decides on the request head alone:
/// `$service<S>` answers what its `refusal(&request)` names, and passes the
/// rest to its `inner` service.
macro_rules! head_check_service {
    ($service:ident) => {
        impl<S, B, ResBody> tower_service::Service<http::Request<B>> for $service<S>
        where
            S: tower_service::Service<http::Request<B>, Response = http::Response<ResBody>>,
        {
            type Response = http::Response<$crate::protect::ProtectedBody<ResBody>>;
            type Error = S::Error;
            type Future = $crate::protect::ProtectedFuture<S::Future>;

            fn poll_ready(
                &mut self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                self.inner.poll_ready(cx)
            }

            fn call(&mut self, request: http::Request<B>) -> Self::Future {
                match self.refusal(&request) {
                    Some((kind, answer)) => $crate::protect::ProtectedFuture::refused(kind, answer),
                    None => $crate::protect::ProtectedFuture::called(self.inner.call(request)),
                }
            }
        }
    };
}
