//! Where a [`Server`](super::Server) gets its connections from.

use std::fmt;
use std::future::Future;
use std::io;

use tokio::io::{AsyncRead, AsyncWrite};

/// A source of client connections for [`Server::serve`](super::Server::serve),
/// like axum's `serve::Listener`: a Tokio [`TcpListener`](tokio::net::TcpListener)
/// (the binary's), or any other transport — a Unix socket, a TLS acceptor,
/// an in-memory or simulated network.
///
/// Every protection of the server applies to what it accepts: the
/// connection cap, the head, keep-alive and send timeouts, the request and
/// reset budgets. An `accept` error is taken as passing (out of
/// descriptors and the like): the server backs off and calls again, so an
/// error that will never go away should instead keep `accept` pending.
/// `accept` must be cancel-safe, as Tokio's is: the server drops a pending
/// `accept` when it shuts down, or when a connection closes at the cap
/// while it waited for one to make room for.
///
/// A listener over a transport of one's own:
///
/// ```
/// use std::io;
/// use mcp_id_guard::server::Listener;
/// use tokio::io::DuplexStream;
/// use tokio::sync::mpsc;
///
/// /// Connections handed over in memory, each named by a number.
/// struct InMemory(mpsc::Receiver<(DuplexStream, u64)>);
///
/// impl Listener for InMemory {
///     type Io = DuplexStream;
///     type Addr = u64;
///
///     async fn accept(&mut self) -> io::Result<(DuplexStream, u64)> {
///         match self.0.recv().await {
///             Some(connection) => Ok(connection),
///             // No sender left: nothing more will come.
///             None => std::future::pending().await,
///         }
///     }
///
///     fn local_addr(&self) -> io::Result<u64> {
///         Ok(0)
///     }
/// }
/// # let (_tx, rx) = mpsc::channel(1);
/// # let _ = InMemory(rx);
/// ```
pub trait Listener: Send + 'static {
    /// A connection's byte stream.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// A client's address, handed to the service maker and named in log
    /// lines.
    type Addr: Clone + fmt::Debug + Send + Sync + 'static;

    /// The next connection and its client's address.
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Io, Self::Addr)>> + Send;

    /// The address this listener accepts on.
    ///
    /// # Errors
    /// When the transport cannot tell.
    fn local_addr(&self) -> io::Result<Self::Addr>;
}

/// Accepted connections get `TCP_NODELAY`: small SSE events and JSON answers
/// must not wait for Nagle's algorithm.
impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> io::Result<(Self::Io, Self::Addr)> {
        let (stream, peer) = Self::accept(self).await?;
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        Ok((stream, peer))
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Self::local_addr(self)
    }
}
