//! The accept loop: the connection cap, backoff when `accept` fails, and the
//! graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tokio::sync::{watch, Semaphore};
use tower_service::Service;

use super::connection::{self, Ending};
use super::{ClientBody, Listener};
use super::{ServiceError, Setup};
use crate::throttle::Throttle;

/// The first pause after a failed `accept`.
const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest pause after failed `accept`s in a row.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long connections cut at the end of the grace period may take to
/// drop.
const CUT_BOUND: Duration = Duration::from_millis(100);

/// The warnings of the loop, each at most once per interval.
const TABLE_FULL: usize = 0;
const ACCEPT_FAILED: usize = 1;

pub(super) async fn serve<L, M, S, B, F>(
    shared: &Arc<Setup>,
    mut listener: L,
    mut make_service: M,
    shutdown: F,
) where
    L: Listener,
    M: FnMut(L::Addr) -> S,
    S: Service<Request<ClientBody>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<ServiceError>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<ServiceError>,
    F: Future<Output = ()>,
{
    let max = shared.max_connections;
    // One permit per open connection: when none is left, the loop stops
    // accepting (the kernel's backlog holds new connections) instead of
    // running out of descriptors.
    let permits = Arc::new(Semaphore::new(max));
    let (stop, stopped) = watch::channel(false);
    let (cut, cutting) = watch::channel(false);
    let warnings = Throttle::<2>::default();
    let mut backoff = BACKOFF_MIN;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        if permits.available_permits() == 0 {
            if let Some(suppressed) = warnings.ready(TABLE_FULL) {
                tracing::warn!(
                    "{max} client connections open (--max-connections); new ones wait \
                     until one closes ({suppressed} more times since the last such line)"
                );
            }
        }
        // Wait for room without holding a permit while `accept` waits: the
        // permits in use are the open connections.
        tokio::select! {
            permit = permits.acquire() => match permit {
                Ok(permit) => drop(permit),
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    backoff = BACKOFF_MIN;
                    accepted
                }
                Err(error) => {
                    // Out of descriptors and the like: each retry would fail
                    // the same way at once. Back off (up to a second) and log
                    // a line per interval, not per attempt.
                    if let Some(suppressed) = warnings.ready(ACCEPT_FAILED) {
                        tracing::warn!(
                            %error,
                            "accept failed; retrying in {backoff:?} ({suppressed} more failures since the last such line)"
                        );
                    }
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut shutdown => break,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Only this loop takes permits, so the one seen free above still is.
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            continue;
        };
        let ending = Ending {
            stop: stopped.clone(),
            cut: cutting.clone(),
        };
        let service = make_service(peer.clone());
        connection::spawn(shared, stream, peer, service, ending, permit);
    }
    drop(listener);
    let _ = stop.send(true);
    let open = max - permits.available_permits();
    if open > 0 {
        tracing::info!(
            "waiting up to {:?} for {open} open connection(s) to finish",
            shared.grace_period
        );
    }
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    if tokio::time::timeout(shared.grace_period, permits.acquire_many(all))
        .await
        .is_ok()
    {
        tracing::info!("shut down");
        return;
    }
    tracing::warn!(
        "grace period of {:?} over; cutting the connections still open",
        shared.grace_period
    );
    let _ = cut.send(true);
    let _ = tokio::time::timeout(CUT_BOUND, permits.acquire_many(all)).await;
}
