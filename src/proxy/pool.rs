//! Upstream connections, each driven by the request that uses it.
//!
//! hyper-util's pooled client runs every upstream connection in a task of
//! its own: a request reaches that task through a channel, its response
//! comes back through another, and its body one chunk at a time through a
//! third, each a wake-up of the other task (and on a multi-threaded runtime
//! often of the other worker thread, through the kernel). Here the task that
//! serves the client's request drives the upstream connection itself, while
//! it waits for the answer and while it passes the body on, the way one
//! nginx event loop handles both sides: no hand-offs. A connection whose
//! answer has been read to its end goes back to the pool; one abandoned
//! mid-answer (the client went away) is closed.
//!
//! The pool also keeps the operator's bounds: at most `max` connections open,
//! idle ones included (each holds a permit until it closes); a request that
//! finds none free waits up to `wait` for a permit or for a connection to
//! come back, then fails with [`UpstreamBusy`]; idle connections are closed
//! after `idle_timeout`.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::{sleep_until, timeout_at, Instant, Sleep};

use super::capped::{CappedConnection, UpstreamBusy};
use super::connect::Connector;
use super::{BoxError, OutBody};

/// Why the pool could not get an answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Every connection stayed busy for the whole wait.
    Busy(UpstreamBusy),
    /// No connection could be opened.
    Connect(BoxError),
    /// The connection failed before the answer's head arrived; `sent`: the
    /// request may have been written (hyper did not hand it back).
    Send { error: hyper::Error, sent: bool },
    /// The answer's head did not arrive by the deadline; `sent`: the request
    /// had been handed to a connection (else the deadline passed while it
    /// waited for one).
    Timeout { sent: bool },
}

impl Failure {
    /// Whether the upstream may have the request, and may still run it.
    pub(crate) fn sent(&self) -> bool {
        match self {
            Self::Busy(_) | Self::Connect(_) => false,
            Self::Send { sent, .. } | Self::Timeout { sent } => *sent,
        }
    }
}

/// The upstream connections of one [`Proxy`](super::Proxy).
#[derive(Debug)]
pub(crate) struct Pool {
    connector: Connector,
    /// Where the connector connects (`http://authority/`).
    target: Uri,
    idle: Mutex<Vec<Idle>>,
    /// A connection came back to `idle`.
    returned: Notify,
    /// One per open connection; `None`: no cap.
    permits: Option<Arc<Semaphore>>,
    max: usize,
    wait: Duration,
    idle_timeout: Duration,
    /// The task that closes expired idle connections runs.
    sweeping: AtomicBool,
}

#[derive(Debug)]
struct Idle {
    connection: Connection,
    since: Instant,
}

/// One upstream HTTP/1.1 connection: hyper's request handle and the future
/// that does its reading and writing.
#[derive(Debug)]
pub(crate) struct Connection {
    sender: http1::SendRequest<OutBody>,
    /// `None` once it has finished: the connection is closed (or failed).
    driver: Option<Pin<Box<http1::Connection<CappedConnection, OutBody>>>>,
    /// The deadline of the answer in progress. Kept with the connection
    /// and moved on for each request: a later deadline only updates the
    /// registered timer, where a timer per request would be registered in
    /// the runtime's timer wheel and taken out again every time.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Connection {
    /// Lets hyper read and write what it can on this connection now.
    ///
    /// A driver that has finished is dropped at once: a request handed to
    /// the connection after it closed would otherwise wait in hyper's queue
    /// for ever, since nothing reads that queue any more. Dropped, hyper
    /// gives such a request back unsent (and fails what was in flight).
    pub(crate) fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(driver) = &mut self.driver {
            if driver.as_mut().poll(cx).is_ready() {
                self.driver = None;
            }
        }
    }

    /// Whether a next request can go on this connection.
    fn reusable(&mut self, cx: &mut Context<'_>) -> bool {
        self.drive(cx);
        self.is_open()
    }

    /// Whether the connection was open and ready when last driven.
    fn is_open(&self) -> bool {
        self.driver.is_some() && self.sender.is_ready()
    }

    /// Sets the timer for an answer due by `deadline` (`None`: no limit).
    fn arm(&mut self, deadline: Option<Instant>) {
        match (deadline, &mut self.timer) {
            (Some(deadline), Some(timer)) => timer.as_mut().reset(deadline),
            (Some(deadline), None) => self.timer = Some(Box::pin(sleep_until(deadline))),
            (None, _) => self.timer = None,
        }
    }

    /// Whether the armed deadline has passed (registering `cx` otherwise).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.timer
            .as_mut()
            .is_some_and(|timer| timer.as_mut().poll(cx).is_ready())
    }
}

/// A connection checked out of its pool, given back when its answer has
/// been read to the end ([`Lease::release`]) and closed when dropped before.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) connection: Connection,
    pool: Arc<Pool>,
}

impl Lease {
    /// The answer has been read to its end: the connection goes back to
    /// the pool if hyper can send another request on it.
    pub(crate) fn release(mut self, cx: &mut Context<'_>) {
        if self.connection.reusable(cx) {
            self.pool.put(self.connection);
        }
    }
}

impl Pool {
    pub(crate) fn new(
        connector: Connector,
        target: Uri,
        max: Option<usize>,
        wait: Duration,
        idle_timeout: Duration,
    ) -> Self {
        let max = max.map(|max| max.clamp(1, Semaphore::MAX_PERMITS));
        Self {
            connector,
            target,
            idle: Mutex::new(Vec::new()),
            returned: Notify::new(),
            permits: max.map(|max| Arc::new(Semaphore::new(max))),
            max: max.unwrap_or(usize::MAX),
            wait,
            idle_timeout,
            sweeping: AtomicBool::new(false),
        }
    }

    /// Sends `request` (origin-form URI) and waits for the answer's head
    /// until `deadline` (`None`: no limit; the wait for a connection counts),
    /// driving the connection meanwhile; the connection comes back with the
    /// answer, to be driven while its body is read.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut request: Request<OutBody>,
        deadline: Option<Instant>,
    ) -> Result<(Response<Incoming>, Lease), Failure> {
        loop {
            let (mut connection, reused) = match (self.take_idle(), deadline) {
                (Some(connection), _) => (connection, true),
                (None, Some(deadline)) => timeout_at(deadline, self.checkout())
                    .await
                    .map_err(|_| Failure::Timeout { sent: false })??,
                (None, None) => self.checkout().await?,
            };
            connection.arm(deadline);
            // A connection back from the pool is ready: it was driven when
            // its last answer ended. Should the upstream have closed it
            // since, the drive below finds out before writing, and hyper
            // gives the request back unsent. A new connection is driven
            // until hyper takes requests on it.
            let ready = poll_fn(|cx| {
                if connection.sender.is_ready() {
                    return Poll::Ready(Ok(()));
                }
                connection.drive(cx);
                if let Poll::Ready(ready) = connection.sender.poll_ready(cx) {
                    return Poll::Ready(
                        ready.map_err(|error| Failure::Send { error, sent: false }),
                    );
                }
                if connection.expired(cx) {
                    return Poll::Ready(Err(Failure::Timeout { sent: false }));
                }
                Poll::Pending
            })
            .await;
            if let Err(failure) = ready {
                // A pooled connection the upstream closed while it was
                // idle; the request has not left.
                if reused && matches!(failure, Failure::Send { .. }) {
                    continue;
                }
                return Err(failure);
            }
            let mut sending = pin!(connection.sender.try_send_request(request));
            let answered = poll_fn(|cx| {
                connection.drive(cx);
                if let Poll::Ready(answered) = sending.as_mut().poll(cx) {
                    return Poll::Ready(Some(answered));
                }
                if connection.expired(cx) {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            let Some(answered) = answered else {
                return Err(Failure::Timeout { sent: true });
            };
            match answered {
                Ok(response) => {
                    let lease = Lease {
                        connection,
                        pool: Arc::clone(self),
                    };
                    return Ok((response, lease));
                }
                Err(mut error) => match error.take_message() {
                    // Closed before the request was written: try another.
                    Some(again) if reused => request = again,
                    unsent => {
                        return Err(Failure::Send {
                            sent: unsent.is_none(),
                            error: error.into_error(),
                        })
                    }
                },
            }
        }
    }

    /// An idle connection (`true`), or a new one once a permit is free; at
    /// most `wait` for either.
    async fn checkout(&self) -> Result<(Connection, bool), Failure> {
        let mut deadline = None;
        loop {
            if let Some(connection) = self.take_idle() {
                return Ok((connection, true));
            }
            let Some(permits) = &self.permits else {
                return self
                    .connect(None)
                    .await
                    .map(|connection| (connection, false));
            };
            match Arc::clone(permits).try_acquire_owned() {
                Ok(permit) => {
                    return self
                        .connect(Some(permit))
                        .await
                        .map(|connection| (connection, false))
                }
                // The semaphore is never closed.
                Err(TryAcquireError::Closed) => return Err(self.busy()),
                Err(TryAcquireError::NoPermits) => {}
            }
            // Every connection is open and busy: wait for one to come back
            // or to close. Registered before looking again, so a connection
            // put back in between is not missed.
            let mut returned = pin!(self.returned.notified());
            returned.as_mut().enable();
            if let Some(connection) = self.take_idle() {
                return Ok((connection, true));
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.wait);
            tokio::select! {
                permit = Arc::clone(permits).acquire_owned() => {
                    // The semaphore is never closed.
                    let permit = permit.map_err(|_| self.busy())?;
                    return self
                        .connect(Some(permit))
                        .await
                        .map(|connection| (connection, false));
                }
                () = returned => continue,
                () = tokio::time::sleep_until(deadline) => return Err(self.busy()),
            }
        }
    }

    fn busy(&self) -> Failure {
        Failure::Busy(UpstreamBusy {
            max: self.max,
            waited: self.wait,
        })
    }

    /// The most recently used idle connection that was open when it came
    /// back and has not expired; the others it meets are closed. One the
    /// upstream closed meanwhile is found out by [`Pool::send`], which drives
    /// it before sending and then takes another: driving it here as well
    /// would cost every request a second pass through hyper.
    fn take_idle(&self) -> Option<Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(Idle { connection, since }) = idle.pop() {
            if since.elapsed() < self.idle_timeout && connection.is_open() {
                return Some(connection);
            }
        }
        None
    }

    async fn connect(&self, permit: Option<OwnedSemaphorePermit>) -> Result<Connection, Failure> {
        let io = self
            .connector
            .connect(self.target.clone())
            .await
            .map_err(Failure::Connect)?;
        let (sender, driver) = http1::handshake(CappedConnection::new(io, permit))
            .await
            .map_err(|error| Failure::Connect(error.into()))?;
        Ok(Connection {
            sender,
            driver: Some(Box::pin(driver)),
            timer: None,
        })
    }

    fn put(self: &Arc<Self>, connection: Connection) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Idle {
                connection,
                since: Instant::now(),
            });
        self.returned.notify_one();
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            tokio::spawn(sweep(Arc::downgrade(self)));
        }
    }
}

/// Closes idle connections once they have been idle for the pool's idle
/// timeout, until the pool is gone. Checked every eighth of it, so a
/// connection is closed within 1.125 times the timeout: the binary's 4 s
/// default closes it before the 5 s after which uvicorn and Node close
/// theirs. (A checkout never takes one idle for longer than the timeout.)
async fn sweep(pool: Weak<Pool>) {
    let Some(every) = pool
        .upgrade()
        .map(|pool| (pool.idle_timeout / 8).max(Duration::from_millis(10)))
    else {
        return;
    };
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let expired: Vec<Idle> = {
            let mut idle = pool.idle.lock().unwrap_or_else(PoisonError::into_inner);
            let (expired, kept) = std::mem::take(&mut *idle)
                .into_iter()
                .partition(|entry| entry.since.elapsed() >= pool.idle_timeout);
            *idle = kept;
            expired
        };
        // Closed outside the lock.
        drop(expired);
    }
}
