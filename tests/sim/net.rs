//! The library's transport seams over turmoil's simulated TCP: a
//! [`Listener`] for the server and a connector for the proxy.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use mcp_id_guard::server::Listener;

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
/// the simulated network.
#[derive(Clone, Copy)]
pub struct SimConnector;

impl tower_service::Service<http::Uri> for SimConnector {
    type Response = TokioIo<turmoil::net::TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, upstream: http::Uri) -> Self::Future {
        let host = upstream.host().unwrap_or_default().to_owned();
        let port = upstream.port_u16().unwrap_or(80);
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            Ok(TokioIo::new(stream))
        })
    }
}
