//! Request bodies under the binary's memory budget and size cap (issue 30,
//! items 1 and 2): bodies that do not fit what the budget has left are
//! refused at once instead of held, and a body the guard does not track
//! (no session, not JSON) is read whole before it goes upstream, so while
//! it trickles it holds no upstream connection.

use std::convert::Infallible;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::support::process::Guard;
use crate::support::server::serve_service;
use crate::support::{ACCEPT, OK_TIMEOUT};

/// Reads a response head from `stream`: its status line and headers.
async fn response_head(stream: &mut TcpStream, within: Duration) -> anyhow::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(within, async {
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await? == 0 {
                anyhow::bail!("closed after {:?}", String::from_utf8_lossy(&head));
            }
            head.push(byte[0]);
        }
        anyhow::Ok(())
    })
    .await
    .context("no response head")??;
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// A POST head announcing `length` bytes, and the first `sent` of them.
async fn partial_post(
    addr: &str,
    content_type: &str,
    session: Option<&str>,
    length: usize,
    sent: usize,
) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    let session = session.map_or_else(String::new, |id| format!("Mcp-Session-Id: {id}\r\n"));
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: {ACCEPT}\r\nContent-Type: {content_type}\r\n\
         {session}Content-Length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&vec![b' '; sent]).await?;
    Ok(stream)
}

/// An upstream that reports each request head as it arrives (before its
/// body), then reads the body and answers a JSON-RPC result for id 1.
async fn reporting_upstream() -> anyhow::Result<(
    crate::support::server::Served,
    mpsc::UnboundedReceiver<String>,
)> {
    let (heads, seen) = mpsc::unbounded_channel();
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let heads = heads.clone();
        async move {
            let content_type = request
                .headers()
                .get("content-type")
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let _ = heads.send(content_type);
            let _ = request.into_body().collect().await;
            let mut response = Response::new(Full::new(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            )));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Ok::<_, Infallible>(response)
        }
    });
    Ok((serve_service(service).await?, seen))
}

/// Item 2: with one upstream connection, a `text/plain` POST (which the
/// guard does not track) that sends 10 of its 1 000 bytes and then nothing
/// held that connection for as long as it trickled: every other request
/// waited for it and got 503. Now the body is read whole first, and the
/// upstream never sees it until it is complete.
#[tokio::test]
async fn an_untracked_trickle_holds_no_upstream_connection() -> anyhow::Result<()> {
    let (upstream, mut seen) = reporting_upstream().await?;
    let guard = Guard::start(&[
        "--upstream",
        &format!("http://{}", upstream.addr),
        "--max-upstream-connections",
        "1",
        "--upstream-queue-timeout",
        "500ms",
        "--min-request-body-rate",
        "0",
    ])
    .await?;
    let _trickle = partial_post(&guard.addr, "text/plain", None, 1000, 10).await?;
    // Old: the head went upstream at once. Now nothing arrives there; the
    // wait is bounded either way.
    match tokio::time::timeout(Duration::from_secs(1), seen.recv()).await {
        Ok(Some(head)) => println!("the upstream saw the trickling request ({head})"),
        _ => println!("the upstream has not seen the trickling request"),
    }
    let response = tokio::time::timeout(
        OK_TIMEOUT,
        reqwest::Client::new()
            .post(guard.url())
            .header("accept", ACCEPT)
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .send(),
    )
    .await??;
    let status = response.status().as_u16();
    let body = response.text().await?;
    assert_eq!(
        status, 200,
        "a legitimate request behind the trickle: {body}"
    );
    Ok(())
}

/// Item 2: an untracked body announcing more than `--max-body-bytes` gets
/// 413 at once (10 MB went upstream unchecked).
#[tokio::test]
async fn an_untracked_body_over_the_cap_is_refused() -> anyhow::Result<()> {
    let (upstream, _seen) = reporting_upstream().await?;
    let guard = Guard::start(&["--upstream", &format!("http://{}", upstream.addr)]).await?;
    let mut stream = partial_post(&guard.addr, "text/plain", None, 10_000_000, 1000).await?;
    let head = response_head(&mut stream, OK_TIMEOUT).await?;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    Ok(())
}

/// Item 1: with `--max-body-memory-bytes 1048576`, two tracked POSTs that
/// announce 400 000 bytes each and send a quarter of them hold 800 000; a
/// third does not fit and gets 503 with a JSON-RPC error at once, instead
/// of being held with the others (nothing bounded how many were).
#[tokio::test]
async fn bodies_over_the_memory_budget_are_refused_at_once() -> anyhow::Result<()> {
    let (upstream, _seen) = reporting_upstream().await?;
    let guard = Guard::start(&[
        "--upstream",
        &format!("http://{}", upstream.addr),
        "--max-body-memory-bytes",
        "1048576",
        "--min-request-body-rate",
        "0",
    ])
    .await?;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            partial_post(&guard.addr, "application/json", Some("s"), 400_000, 100_000).await?,
        );
    }
    let mut third =
        partial_post(&guard.addr, "application/json", Some("s"), 400_000, 100_000).await?;
    let head = response_head(&mut third, OK_TIMEOUT).await?;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    let mut body = String::new();
    let _ = tokio::time::timeout(OK_TIMEOUT, third.read_to_string(&mut body)).await;
    assert!(
        body.contains(r#""id":null"#) && body.contains("-32000"),
        "{body}"
    );
    for mut stream in held {
        // Still held, not answered.
        assert!(tokio::time::timeout(
            Duration::from_millis(100),
            response_head(&mut stream, OK_TIMEOUT)
        )
        .await
        .is_err());
    }
    Ok(())
}
