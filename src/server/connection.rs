//! One accepted connection: its watchdog, and the hyper service that admits
//! each request, answers those that arrive on a closing connection, and
//! hands the rest to the connection's tower service.

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION};
use http::{Request, Response, Version};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, OwnedSemaphorePermit};
use tower_service::Service;

use super::activity::{Activity, Allowance};
use super::body::Tracked;
use super::io::Watched;
use super::ClientBody;
use super::{watchdog, ServiceError, Setup};
use crate::protect::{ProtectedBody, Refused};
use crate::wire::answer;

/// What ends a connection from outside: `stop` asks it to finish and close,
/// `cut` drops it (the grace period is over).
pub(super) struct Ending {
    pub(super) stop: watch::Receiver<bool>,
    pub(super) cut: watch::Receiver<bool>,
}

/// Serves `stream` on a task of its own, which holds `permit` (one of the
/// connection cap's) until the connection is gone. The connection's
/// activity comes back, for the accept loop to find idle connections at
/// the cap.
pub(super) fn spawn<I, A, S, B>(
    shared: &Arc<Setup>,
    stream: I,
    peer: A,
    service: S,
    ending: Ending,
    permit: OwnedSemaphorePermit,
) -> Arc<Activity>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    A: fmt::Debug + Send + 'static,
    S: Service<Request<ClientBody>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<ServiceError>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<ServiceError>,
{
    let open = shared.metrics.as_ref().map(|metrics| metrics.connection());
    let activity = Activity::new(&shared.limits, shared.metrics.clone());
    let watched = Arc::clone(&activity);
    let shared_ = Arc::clone(shared);
    let per_request = hyper::service::service_fn(move |request: Request<Incoming>| {
        request_arrived(&shared_, &watched, service.clone(), request)
    });
    let served = Box::pin(
        shared
            .http
            .serve_connection(
                TokioIo::new(Watched::new(stream, Arc::clone(&activity))),
                per_request,
            )
            .into_owned(),
    );
    let limits = shared.limits;
    let Ending { stop, mut cut } = ending;
    let watched = Arc::clone(&activity);
    tokio::spawn(async move {
        let driven = watchdog::drive(
            served,
            |served| served.graceful_shutdown(),
            watched,
            limits,
            stop,
            peer,
        );
        tokio::select! {
            () = driven => {}
            // Past the grace period (or with the server gone): dropped.
            _ = cut.wait_for(|cut| *cut) => {}
        }
        drop(open);
        drop(permit);
    });
    activity
}

/// Admits one request: to the service, or answered here when its connection
/// is closing for a budget (an HTTP/2 stream is refused, which clients send
/// again on a new connection; a pipelined HTTP/1.1 request gets a `503`).
fn request_arrived<S, B>(
    shared: &Setup,
    activity: &Arc<Activity>,
    mut service: S,
    request: Request<Incoming>,
) -> impl std::future::Future<Output = Result<Response<Tracked<ProtectedBody<B>>>, ServiceError>>
where
    S: Service<Request<ClientBody>, Response = Response<B>>,
    S::Error: Into<ServiceError>,
    B: Body<Data = Bytes>,
{
    let http2 = request.version() == Version::HTTP_2;
    let (mut active, admission) = activity.request_started(http2);
    // Only an HTTP/2 stream needs its response watched for a client that
    // stops taking it: on HTTP/1.1 hyper stops polling a body only when its
    // write buffer is full, that is, when the socket write blocked, which
    // the watchdog's blocked-write rule already times out. Watching there
    // too would cost every streamed response a task and a timer, and see
    // no more: both fire only once the kernel's send buffer (up to a few
    // MiB) is full, so a slow stream to a client that reads nothing runs
    // until it has filled it, as behind nginx's send_timeout.
    let send = shared.limits.send.filter(|_| http2);
    let metrics = shared.metrics.clone();
    let activity = Arc::clone(activity);
    let started = Instant::now();
    async move {
        let closing = match admission {
            Allowance::Refuse(_) if http2 => {
                if let Some(metrics) = &metrics {
                    metrics.refused(Refused::ConnectionClosing);
                }
                // hyper resets the stream with the reason it finds in the
                // error; not a reset by the client.
                active.finish();
                return Err(h2::Error::from(h2::Reason::REFUSED_STREAM).into());
            }
            Allowance::Refuse(reason) => Some(reason),
            _ => None,
        };
        let mut response = match closing {
            Some(reason) => {
                let mut response =
                    answer::connection_closing(reason.refusal()).map(ProtectedBody::refusal);
                response.extensions_mut().insert(Refused::ConnectionClosing);
                if let Some(metrics) = &metrics {
                    metrics.answered(&response, started.elapsed(), 0);
                }
                response
            }
            None => {
                let served = async {
                    poll_fn(|cx| service.poll_ready(cx)).await?;
                    service.call(request).await
                };
                match served.await {
                    Ok(response) => response.map(ProtectedBody::inner),
                    Err(error) => {
                        active.finish();
                        return Err(error.into());
                    }
                }
            }
        };
        if !http2 && admission != Allowance::Serve {
            // hyper closes an HTTP/1.1 connection after a response that says
            // so, whenever the watchdog's graceful close lands.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        if matches!(
            response.extensions().get::<Refused>(),
            Some(Refused::BodyIdle | Refused::BodySlow)
        ) {
            // A body-pace layer gave up on the client's body: what is left
            // of it on the connection is unread, so the connection goes.
            activity.request_close();
        }
        Ok(response.map(|body| Tracked::new(body, active, send)))
    }
}
