//! The body budget under the attack that held it: slow bodies announcing
//! the size cap. 16 connections announcing 4 MiB each and sending a few
//! bytes held all 64 MiB of the binary's budget while a `Content-Length`
//! was held for up front, and every other body got 503; bodies are now
//! charged for what has arrived of them, so small requests, and large ones
//! that do send their bytes, keep flowing while the attack runs.

use std::convert::Infallible;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use futures::StreamExt as _;
use http::Request;
use http_body::Frame;
use http_body_util::{Full, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use crate::bodies::{held, held_bodies, partial_post, reporting_upstream, response_head};
use crate::hardening::admin_base;
use crate::support::process::Guard;
use crate::support::{ACCEPT, OK_TIMEOUT};

/// What each attacking body announces: the size cap, 4 MiB.
const ANNOUNCED: usize = 4 * 1024 * 1024;

/// A legitimate ping: 40 bytes.
const PING: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

/// A POST of `body` on a new connection, over HTTP/2 or HTTP/1.1: its
/// status, bounded in time.
async fn post(addr: &str, http2: bool, content_type: &str, body: Bytes) -> anyhow::Result<u16> {
    let stream = TcpStream::connect(addr).await?;
    let request = Request::post(format!("http://{addr}/mcp"))
        .header("content-type", content_type)
        .header("accept", ACCEPT)
        .header("mcp-session-id", "s")
        .header("content-length", body.len().to_string())
        .body(Full::new(body))?;
    let exchange = async {
        let response = if http2 {
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await?;
            tokio::spawn(connection);
            sender.ready().await?;
            sender.send_request(request).await?
        } else {
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            sender.ready().await?;
            sender.send_request(request).await?
        };
        anyhow::Ok(response.status().as_u16())
    };
    tokio::time::timeout(OK_TIMEOUT, exchange)
        .await
        .context("no answer")?
}

#[tokio::test]
async fn slow_bodies_announcing_the_cap_leave_small_requests_flowing() -> anyhow::Result<()> {
    let (upstream, _seen) = reporting_upstream().await?;
    let guard = Guard::start(&[
        "--upstream",
        &format!("http://{}", upstream.addr),
        // The attack sent faster than the minimum rate; here it is off, so
        // that nothing but the budget decides.
        "--min-request-body-rate",
        "0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .await?;
    let admin = admin_base(&guard).await?;

    // 8 HTTP/1.1 connections and 8 HTTP/2 ones, each a body announcing
    // 4 MiB of which 250 bytes are sent.
    let mut http1 = Vec::new();
    for _ in 0..8 {
        http1.push(partial_post(&guard.addr, "application/json", Some("s"), ANNOUNCED, 250).await?);
    }
    let mut http2 = Vec::new();
    for _ in 0..8 {
        let stream = TcpStream::connect(&guard.addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        tokio::spawn(connection);
        let frames = futures::stream::iter([Ok::<_, Infallible>(Frame::data(Bytes::from_static(
            &[b' '; 250],
        )))])
        .chain(futures::stream::pending());
        let request = Request::post(format!("http://{}/mcp", guard.addr))
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .header("mcp-session-id", "s")
            .header("content-length", ANNOUNCED.to_string())
            .body(StreamBody::new(frames))?;
        sender.ready().await?;
        let response = tokio::spawn(sender.send_request(request));
        http2.push((sender, response));
    }
    held_bodies(&admin, |_, bodies| bodies == 16).await?;

    // Pings and 1 MiB POSTs, over both protocols, while the 16 are held.
    let mut statuses = Vec::new();
    for http2 in [false, true] {
        for _ in 0..5 {
            statuses.push(
                post(
                    &guard.addr,
                    http2,
                    "application/json",
                    Bytes::from_static(PING),
                )
                .await?,
            );
        }
        let large = Bytes::from(vec![b' '; 1024 * 1024]);
        statuses.push(post(&guard.addr, http2, "text/plain", large).await?);
    }
    let (bytes, bodies) = held(&admin).await?;
    assert_eq!(
        statuses,
        [200; 12],
        "5 pings and a 1 MiB POST over HTTP/1.1, then HTTP/2, while {bodies} bodies hold {bytes} bytes"
    );

    // The attack's bodies are still held, charged for what they sent.
    assert_eq!(bodies, 16);
    assert!(bytes <= 16 * 500, "{bytes} bytes held");
    for stream in &mut http1 {
        assert!(
            tokio::time::timeout(Duration::from_millis(50), response_head(stream, OK_TIMEOUT))
                .await
                .is_err(),
            "an attacking HTTP/1.1 body was answered"
        );
    }
    for (_, response) in &http2 {
        assert!(!response.is_finished(), "an attacking stream was answered");
    }
    Ok(())
}
