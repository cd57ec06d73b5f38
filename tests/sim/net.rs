//! The library's transport seams over turmoil's simulated TCP: a
//! [`Listener`] for the server and a connector for the proxy, which resets
//! some of its connections part way through a response (turmoil injects no
//! resets of its own between running hosts).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use hyper_util::rt::TokioIo;
use mcp_id_guard::server::Listener;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A simulated host's listening socket.
pub struct SimListener(pub turmoil::net::TcpListener);

impl Listener for SimListener {
    type Io = turmoil::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> io::Result<(Self::Io, Self::Addr)> {
        self.0.accept().await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// Connects the proxy to the host and port its upstream URI names, over
/// the simulated network. A share of the connections (`rate`, chosen by
/// `rng`) is reset after a number of bytes read: a cut the proxy sees while
/// the server, which sees only the connection close, runs on.
#[derive(Clone)]
pub struct SimConnector {
    resets: Arc<Mutex<(StdRng, f64)>>,
    /// Resets come within this many bytes read.
    within: usize,
}

impl SimConnector {
    pub fn new(rng: StdRng, rate: f64) -> Self {
        Self {
            resets: Arc::new(Mutex::new((rng, rate))),
            // Past a response head and an SSE stream's first events.
            within: 2_000,
        }
    }

    /// Resets within the first `bytes` read: before a response head
    /// completes, where a proxy answers `502` for the server.
    pub fn within(mut self, bytes: usize) -> Self {
        self.within = bytes;
        self
    }

    /// After how many bytes read the next connection is reset, if it is.
    fn reset_after(&self) -> Option<usize> {
        let mut resets = self.resets.lock().unwrap_or_else(|p| p.into_inner());
        let (rng, rate) = &mut *resets;
        let rate = *rate;
        rng.random_bool(rate)
            .then(|| rng.random_range(0..self.within))
    }
}

/// A simulated TCP stream that fails with `ConnectionReset` once `left`
/// bytes have been read from it.
pub struct Resetting {
    stream: turmoil::net::TcpStream,
    left: Option<usize>,
}

impl AsyncRead for Resetting {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(left) = this.left else {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        };
        if left == 0 {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        let mut room = vec![0; left.min(buf.remaining())];
        let mut limited = ReadBuf::new(&mut room);
        ready!(Pin::new(&mut this.stream).poll_read(cx, &mut limited))?;
        let read = limited.filled();
        this.left = Some(left - read.len());
        buf.put_slice(read);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Resetting {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl tower_service::Service<http::Uri> for SimConnector {
    type Response = TokioIo<Resetting>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, upstream: http::Uri) -> Self::Future {
        let host = upstream.host().unwrap_or_default().to_owned();
        let port = upstream.port_u16().unwrap_or(80);
        let left = self.reset_after();
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            Ok(TokioIo::new(Resetting { stream, left }))
        })
    }
}
