//! How the proxy opens an upstream connection: hyper-util's `HttpConnector`
//! (TCP, the default), or a connector of the application's own
//! ([`ProxyBuilder::connector`](super::ProxyBuilder::connector)).
//!
//! The default path stays unboxed: only a connector of one's own pays for
//! a boxed future per connection and a virtual call per read and write.

use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use super::BoxError;

/// An upstream connection's byte stream, as a connector of one's own gives
/// it.
pub(crate) trait Io: Read + Write + Send + Unpin {}

impl<T: Read + Write + Send + Unpin> Io for T {}

type Connecting = Pin<Box<dyn Future<Output = Result<Box<dyn Io>, BoxError>> + Send>>;

/// Opens upstream connections.
#[derive(Clone)]
pub(crate) enum Connector {
    /// TCP, with the builder's connect timeout, `TCP_NODELAY` and keep-alive.
    Http(HttpConnector),
    /// The application's, under the builder's connect timeout.
    Custom {
        connect: Arc<dyn Fn(Uri) -> Connecting + Send + Sync>,
        timeout: Duration,
    },
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http(connector) => f.debug_tuple("Http").field(connector).finish(),
            Self::Custom { timeout, .. } => f
                .debug_struct("Custom")
                .field("timeout", timeout)
                .finish_non_exhaustive(),
        }
    }
}

impl Connector {
    /// The application's `connector`: each connection from a clone of it,
    /// made ready first (as hyper-util's client does), within `timeout`.
    pub(crate) fn custom<C>(connector: C, timeout: Duration) -> Self
    where
        C: Service<Uri> + Clone + Send + Sync + 'static,
        C::Response: Read + Write + Send + Unpin + 'static,
        C::Error: Into<BoxError>,
        C::Future: Send + 'static,
    {
        let connect = move |target: Uri| -> Connecting {
            let mut connector = connector.clone();
            Box::pin(async move {
                poll_fn(|cx| connector.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
                let io = connector.call(target).await.map_err(Into::into)?;
                Ok(Box::new(io) as Box<dyn Io>)
            })
        };
        Self::Custom {
            connect: Arc::new(connect),
            timeout,
        }
    }

    /// This connector under the connect timeout `timeout` (the TCP one has
    /// its own).
    pub(crate) fn with_timeout(self, timeout: Duration) -> Self {
        match self {
            Self::Custom { connect, .. } => Self::Custom { connect, timeout },
            http @ Self::Http(_) => http,
        }
    }

    /// A new connection to `target` (`http://authority/`).
    pub(crate) async fn connect(&self, target: Uri) -> Result<UpstreamIo, BoxError> {
        match self {
            Self::Http(connector) => connector
                .clone()
                .call(target)
                .await
                .map(UpstreamIo::Tcp)
                .map_err(Into::into),
            Self::Custom { connect, timeout } => {
                // Timed out as `TimedOut`, which the `502` names as a
                // connect timeout, as with the TCP connector.
                match tokio::time::timeout(*timeout, connect(target)).await {
                    Ok(connected) => connected.map(UpstreamIo::Custom),
                    Err(_) => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the connector did not connect within {timeout:?}"),
                    )
                    .into()),
                }
            }
        }
    }
}

/// An upstream connection's byte stream.
pub(crate) enum UpstreamIo {
    Tcp(TokioIo<TcpStream>),
    Custom(Box<dyn Io>),
}

impl fmt::Debug for UpstreamIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(io) => f.debug_tuple("Tcp").field(io).finish(),
            Self::Custom(_) => f.write_str("Custom"),
        }
    }
}

impl Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(io) => Pin::new(io).poll_read(cx, buf),
            Self::Custom(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(io) => Pin::new(io).poll_write(cx, buf),
            Self::Custom(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(io) => Pin::new(io).poll_flush(cx),
            Self::Custom(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(io) => Pin::new(io).poll_shutdown(cx),
            Self::Custom(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Tcp(io) => io.is_write_vectored(),
            Self::Custom(io) => io.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Custom(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
}
