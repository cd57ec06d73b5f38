//! A cap on open upstream connections.
//!
//! hyper-util's pooled client opens a new connection whenever no idle one is
//! free, so a burst of N concurrent requests opens N upstream connections
//! (and keeps them in the pool afterwards). The connector here takes a
//! permit before it connects and the connection holds it until it closes,
//! so at most `max` connections exist, idle ones included. A request that
//! finds none free waits, up to a bound, for a permit or for a pooled
//! connection to come back (the client races both), then fails with
//! [`UpstreamBusy`].

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

use super::BoxError;

/// Every permit was held for the whole wait.
#[derive(Debug)]
pub(crate) struct UpstreamBusy {
    pub(crate) max: usize,
    pub(crate) waited: Duration,
}

impl fmt::Display for UpstreamBusy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "all {} upstream connections stayed busy for {:?}",
            self.max, self.waited
        )
    }
}

impl std::error::Error for UpstreamBusy {}

/// [`HttpConnector`] with a permit per open connection.
#[derive(Debug, Clone)]
pub(crate) struct CappedConnector {
    inner: HttpConnector,
    /// `None`: no cap.
    permits: Option<Arc<Semaphore>>,
    max: usize,
    wait: Duration,
}

impl CappedConnector {
    pub(crate) fn new(inner: HttpConnector, max: Option<usize>, wait: Duration) -> Self {
        let max = max.map(|max| max.clamp(1, Semaphore::MAX_PERMITS));
        Self {
            inner,
            permits: max.map(|max| Arc::new(Semaphore::new(max))),
            max: max.unwrap_or(usize::MAX),
            wait,
        }
    }
}

impl Service<Uri> for CappedConnector {
    type Response = CappedConnection;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<CappedConnection, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        // The connector's future does nothing until polled: the connection
        // is only opened once the permit is held.
        let connecting = self.inner.call(uri);
        let permits = self.permits.clone();
        let (max, wait) = (self.max, self.wait);
        Box::pin(async move {
            let permit = match permits {
                Some(permits) => match tokio::time::timeout(wait, permits.acquire_owned()).await {
                    Ok(Ok(permit)) => Some(permit),
                    // The semaphore is never closed.
                    Ok(Err(closed)) => return Err(closed.into()),
                    Err(_) => return Err(Box::new(UpstreamBusy { max, waited: wait }) as BoxError),
                },
                None => None,
            };
            let io = connecting.await?;
            Ok(CappedConnection {
                io,
                _permit: permit,
            })
        })
    }
}

/// An upstream connection holding its permit until it is dropped (closed).
#[derive(Debug)]
pub(crate) struct CappedConnection {
    io: TokioIo<TcpStream>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Connection for CappedConnection {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

impl Read for CappedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for CappedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
