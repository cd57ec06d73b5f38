//! An upstream connection that holds its permit of the pool's cap until it
//! closes, so at most `max` connections exist, idle ones included (see
//! [`pool`](super::pool)), and the error of a request that found every one
//! busy for the whole wait.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::{Read, ReadBufCursor, Write};
use tokio::sync::OwnedSemaphorePermit;

use super::connect::UpstreamIo;

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

/// An upstream connection holding its permit until it is dropped (closed).
#[derive(Debug)]
pub(crate) struct CappedConnection {
    io: UpstreamIo,
    _permit: Option<OwnedSemaphorePermit>,
}

impl CappedConnection {
    pub(crate) fn new(io: UpstreamIo, permit: Option<OwnedSemaphorePermit>) -> Self {
        Self {
            io,
            _permit: permit,
        }
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
