//! The accept loop: the connection cap, backoff when `accept` fails, and the
//! graceful shutdown.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tokio::sync::{watch, Semaphore};
use tower_service::Service;

use super::activity::Activity;
use super::connection::{self, Ending};
use super::{ClientBody, Listener};
use super::{ServiceError, Setup};
use crate::throttle::Throttle;

/// The first pause after a failed `accept`.
const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest pause after failed `accept`s in a row.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How often the accept loop looks for an idle connection while a new one
/// waits at the cap and none is idle.
const ROOM_RETRY: Duration = Duration::from_millis(50);
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
    let mut connections = Open::default();
    let mut shutdown = std::pin::pin!(shutdown);
    'serve: loop {
        if permits.available_permits() == 0 {
            if let Some(suppressed) = warnings.ready(TABLE_FULL) {
                if shared.close_idle_at_capacity {
                    tracing::warn!(
                        "{max} client connections open (--max-connections); idle ones close \
                         to make room for new ones, which otherwise wait until one closes \
                         ({suppressed} more times since the last such line)"
                    );
                } else {
                    tracing::warn!(
                        "{max} client connections open (--max-connections); new ones wait \
                         until one closes ({suppressed} more times since the last such line)"
                    );
                }
            }
        }
        // Wait for room without holding a permit while `accept` waits: the
        // permits in use are the open connections. At the cap, a connection
        // that arrives is taken in to wait for room (one descriptor over
        // the cap), so that an idle one can be told to make room for it.
        let waiting = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = permits.acquire() => match permit {
                Ok(permit) => {
                    drop(permit);
                    None
                }
                Err(_) => break,
            },
            accepted = accept(&mut listener, &mut backoff, &warnings),
                if shared.close_idle_at_capacity => match accepted {
                Some(accepted) => Some(accepted),
                None => continue,
            },
        };
        let (stream, peer) = match waiting {
            Some(accepted) => {
                // Look again every `ROOM_RETRY` while no connection is idle:
                // one becomes idle when its request ends, which nothing
                // reports to this loop (a report would cost every request).
                loop {
                    connections.make_room();
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break 'serve,
                        permit = permits.acquire() => match permit {
                            Ok(permit) => {
                                drop(permit);
                                break;
                            }
                            Err(_) => break 'serve,
                        },
                        () = tokio::time::sleep(ROOM_RETRY) => {}
                    }
                }
                accepted
            }
            None => tokio::select! {
                () = &mut shutdown => break,
                accepted = accept(&mut listener, &mut backoff, &warnings) => match accepted {
                    Some(accepted) => accepted,
                    None => continue,
                },
            },
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
        let activity = connection::spawn(shared, stream, peer, service, ending, permit);
        if shared.close_idle_at_capacity {
            connections.add(&activity, max);
        }
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

/// The next connection, or `None` after `accept` failed (out of descriptors
/// and the like: each retry would fail the same way at once, so this backs
/// off, up to a second, and logs a line per interval, not per attempt).
async fn accept<L: Listener>(
    listener: &mut L,
    backoff: &mut Duration,
    warnings: &Throttle<2>,
) -> Option<(L::Io, L::Addr)> {
    match listener.accept().await {
        Ok(accepted) => {
            *backoff = BACKOFF_MIN;
            Some(accepted)
        }
        Err(error) => {
            if let Some(suppressed) = warnings.ready(ACCEPT_FAILED) {
                tracing::warn!(
                    %error,
                    "accept failed; retrying in {backoff:?} ({suppressed} more failures since the last such line)"
                );
            }
            tokio::time::sleep(*backoff).await;
            *backoff = (*backoff * 2).min(BACKOFF_MAX);
            None
        }
    }
}

/// The open connections, as the accept loop finds an idle one among them
/// to make room at the cap. Weak: a connection that ended is not kept.
#[derive(Default)]
struct Open {
    connections: Vec<Weak<Activity>>,
    /// The connection last told to make room, while it may still be on its
    /// way out: no other is told meanwhile, or a wait longer than its
    /// close would cost a second idle connection.
    leaving: Option<Weak<Activity>>,
}

impl Open {
    fn add(&mut self, activity: &Arc<Activity>, max: usize) {
        // Ended connections are swept when they are as many as the open
        // ones can be: the list stays within twice the cap, at a cost
        // spread over the connections accepted meanwhile.
        if self.connections.len() >= max.saturating_mul(2) {
            self.connections
                .retain(|weak| weak.upgrade().is_some_and(|open| !open.ended()));
        }
        self.connections.push(Arc::downgrade(activity));
    }

    /// Tells the connection idle the longest to close (the one its client
    /// is least likely to use again), unless the one told last is still on
    /// its way out.
    fn make_room(&mut self) {
        if self
            .leaving
            .as_ref()
            .and_then(Weak::upgrade)
            .is_some_and(|leaving| leaving.leaving())
        {
            return;
        }
        self.leaving = None;
        let idlest = self
            .connections
            .iter()
            .filter_map(|weak| {
                let open = weak.upgrade()?;
                let since = open.idle_since()?;
                Some((since, open))
            })
            .min_by_key(|(since, _)| *since);
        if let Some((_, open)) = idlest {
            if open.make_room() {
                tracing::debug!(
                    "closing the connection idle the longest to make room for a new one"
                );
                self.leaving = Some(Arc::downgrade(&open));
            }
        }
    }
}
