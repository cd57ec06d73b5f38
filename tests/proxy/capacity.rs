//! The library server's connection cap (`mcp_id_guard::server`): at the cap,
//! the connection idle the longest closes to make room for a new one, as
//! nginx closes its idle keep-alive connections when it runs out; busy
//! connections keep their slots, and the new one waits for one of them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use mcp_id_guard::server::{ClientBody, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use crate::support::OK_TIMEOUT;

/// How long a connection that must wait is watched not being served.
const NOT_SERVED: Duration = Duration::from_millis(300);

/// A server capped at two connections. `GET /` answers `ok` at once;
/// `GET /hold` reports its arrival on the returned channel and answers once
/// a permit is added to the returned semaphore.
struct Capped {
    address: SocketAddr,
    arrived: mpsc::UnboundedReceiver<()>,
    release: Arc<Semaphore>,
    _server: tokio::task::JoinHandle<()>,
}

impl Capped {
    async fn start(close_idle: bool) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (arrivals, arrived) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let held = Arc::clone(&release);
        let service = tower::service_fn(move |request: Request<ClientBody>| {
            let arrivals = arrivals.clone();
            let held = Arc::clone(&held);
            async move {
                if request.uri().path() == "/hold" {
                    let _ = arrivals.send(());
                    if let Ok(permit) = held.acquire().await {
                        permit.forget();
                    }
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        });
        let server = Server::builder()
            .max_connections(2)
            .close_idle_at_capacity(close_idle)
            .build();
        let task = tokio::spawn(async move {
            server
                .serve(listener, |_| service.clone(), std::future::pending())
                .await;
        });
        Ok(Self {
            address,
            arrived,
            release,
            _server: task,
        })
    }

    async fn connect(&self) -> anyhow::Result<TcpStream> {
        Ok(TcpStream::connect(self.address).await?)
    }
}

/// Sends `GET path` on `stream`.
async fn send(stream: &mut TcpStream, path: &str) -> anyhow::Result<()> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    Ok(())
}

/// Reads one whole answer (its body is `ok`) off `stream`.
async fn answer(stream: &mut TcpStream) -> anyhow::Result<String> {
    let mut read = Vec::new();
    while !read.ends_with(b"\r\n\r\nok") {
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "closed before a whole answer: {read:?}");
        read.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8(read)?)
}

/// `GET /` on `stream`, answered within `within`.
async fn exchange(stream: &mut TcpStream, within: Duration) -> anyhow::Result<String> {
    send(stream, "/").await?;
    tokio::time::timeout(within, answer(stream))
        .await
        .with_context(|| format!("no answer within {within:?}"))?
}

/// Waits for the server to close `stream` gracefully (end of stream, not a
/// reset).
async fn closed(stream: &mut TcpStream) -> anyhow::Result<()> {
    let mut byte = [0u8; 1];
    let n = tokio::time::timeout(OK_TIMEOUT, stream.read(&mut byte))
        .await
        .context("the connection stayed open")??;
    anyhow::ensure!(n == 0, "unexpected bytes on a closed connection");
    Ok(())
}

/// Two idle keep-alive connections fill the cap; a third is served at once,
/// the one idle the longer is closed gracefully for it, and the other stays
/// open and usable.
#[tokio::test]
async fn the_longest_idle_connection_makes_room() -> anyhow::Result<()> {
    let server = Capped::start(true).await?;
    let mut first = server.connect().await?;
    exchange(&mut first, OK_TIMEOUT).await?;
    let mut second = server.connect().await?;
    exchange(&mut second, OK_TIMEOUT).await?;
    let mut third = server.connect().await?;
    exchange(&mut third, Duration::from_secs(3)).await?;
    closed(&mut first).await?;
    exchange(&mut second, OK_TIMEOUT).await?;
    Ok(())
}

/// Connections with a request in progress keep their slots: a third waits,
/// and is served once one request has been answered whole (that connection,
/// idle then, closes for it).
#[tokio::test]
async fn busy_connections_keep_their_slots() -> anyhow::Result<()> {
    let mut server = Capped::start(true).await?;
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut stream = server.connect().await?;
        send(&mut stream, "/hold").await?;
        tokio::time::timeout(OK_TIMEOUT, server.arrived.recv())
            .await
            .context("a held request never arrived")?;
        busy.push(stream);
    }
    let mut third = server.connect().await?;
    send(&mut third, "/").await?;
    assert!(
        tokio::time::timeout(NOT_SERVED, answer(&mut third))
            .await
            .is_err(),
        "a third connection was served beside two busy ones"
    );
    server.release.add_permits(1);
    // Whichever of the two was released gets its whole answer, then the
    // close; the third is served.
    let (zero, one) = busy.split_at_mut(1);
    let released = tokio::select! {
        answered = answer(&mut zero[0]) => { answered?; 0 }
        answered = answer(&mut one[0]) => { answered?; 1 }
        () = tokio::time::sleep(OK_TIMEOUT) => anyhow::bail!("no held request was answered"),
    };
    tokio::time::timeout(OK_TIMEOUT, answer(&mut third))
        .await
        .context("the third connection was not served after a slot freed")??;
    closed(&mut busy[released]).await?;
    server.release.add_permits(1);
    tokio::time::timeout(OK_TIMEOUT, answer(&mut busy[1 - released]))
        .await
        .context("the other held request was not answered")??;
    Ok(())
}

/// Control: with `close_idle_at_capacity(false)`, idle connections keep the
/// cap full and a third is not served.
#[tokio::test]
async fn without_it_idle_connections_keep_the_cap_full() -> anyhow::Result<()> {
    let server = Capped::start(false).await?;
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut stream = server.connect().await?;
        exchange(&mut stream, OK_TIMEOUT).await?;
        open.push(stream);
    }
    let mut third = server.connect().await?;
    send(&mut third, "/").await?;
    assert!(
        tokio::time::timeout(NOT_SERVED, answer(&mut third))
            .await
            .is_err(),
        "a third connection was served beside two idle ones"
    );
    drop(open.pop());
    tokio::time::timeout(OK_TIMEOUT, answer(&mut third)).await??;
    Ok(())
}
