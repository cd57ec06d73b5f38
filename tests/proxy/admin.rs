//! The admin listener (`--admin-listen`) under the connection limits of the
//! main one (issue 30, item 3), so that `/healthz` stays available to a
//! liveness probe whatever its other connections do: clients that pipeline
//! requests and never read their answers, or never finish a head, are cut
//! at the admin send or head timeout (`--admin-send-timeout`,
//! `--admin-header-read-timeout`, a couple of seconds), idle connections
//! make room at the cap, and `--admin-max-connections` sets how many admin connections
//! may be open at once.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::task::JoinSet;

use crate::hardening::{admin_base, get};
use crate::support::process::Guard;
use crate::support::server::refused_port;
use crate::support::OK_TIMEOUT;

/// The admin send timeout the scenarios configure.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// Connects to `admin` with a small receive buffer, pipelines `GET /metrics`
/// until the connection fails, and never reads past the first byte of the
/// first answer. Resolves (through `accepted`) once the admin listener has
/// accepted and answered the connection.
async fn unread_pipeline(
    admin: std::net::SocketAddr,
    accepted: tokio::sync::mpsc::Sender<()>,
) -> anyhow::Result<()> {
    let socket = TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let stream = socket.connect(admin).await?;
    let (mut read, mut write) = stream.into_split();
    let requests = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(100);
    let writer = tokio::spawn(async move {
        // Until the connection is cut (or the test ends).
        while write.write_all(requests.as_bytes()).await.is_ok() {}
        write
    });
    let mut first = [0u8; 1];
    tokio::time::timeout(OK_TIMEOUT, read.read_exact(&mut first))
        .await
        .context("no answer on an attacking connection")??;
    let _ = accepted.send(()).await;
    // Hold the read half unread until the writer ends.
    let _write = writer.await?;
    drop(read);
    Ok(())
}

/// Issue 30, item 3: sixteen connections (the old fixed cap, and the
/// default of `--admin-max-connections`) pipelining `GET /metrics` and never
/// reading took every admin slot for minutes (the admin listener had no
/// send timeout). With the main listener's limits, each is dropped once its
/// writes stay blocked for `--send-timeout`, and `/healthz` answers within
/// about that time.
#[tokio::test]
async fn unread_admin_connections_are_cut_at_the_send_timeout() -> anyhow::Result<()> {
    let refused = refused_port();
    let dead = format!("http://127.0.0.1:{}", refused.port);
    let guard = Guard::start(&[
        "--upstream",
        &dead,
        "--admin-listen",
        "127.0.0.1:0",
        "--admin-send-timeout",
        "1s",
        // The client send timeout is not the admin listener's.
        "--send-timeout",
        "0",
    ])
    .await?;
    let admin = admin_base(&guard).await?;
    let address: std::net::SocketAddr = admin.trim_start_matches("http://").parse()?;
    let attackers = 16;
    let (accepted, mut answered) = tokio::sync::mpsc::channel(attackers);
    let mut attacks = JoinSet::new();
    for _ in 0..attackers {
        attacks.spawn(unread_pipeline(address, accepted.clone()));
    }
    for _ in 0..attackers {
        tokio::time::timeout(OK_TIMEOUT, answered.recv())
            .await
            .context("an attacking connection was never served")?;
    }
    // Every slot of the old listener is now taken by a client that does not
    // read.
    let started = Instant::now();
    let deadline = SEND_TIMEOUT + Duration::from_secs(2);
    let healthz = tokio::time::timeout(deadline, get(&format!("{admin}/healthz"))).await;
    let waited = started.elapsed();
    println!("/healthz after {waited:?} behind {attackers} unread pipelining connections");
    let (status, _) = healthz.with_context(|| {
        format!("/healthz unavailable for {deadline:?} behind {attackers} unread connections")
    })??;
    assert_eq!(status, 200);
    attacks.abort_all();
    Ok(())
}

/// The address of a binary's admin listener, started with `extra` flags
/// behind a dead upstream (the admin endpoints need none).
async fn admin_guard(extra: &[&str]) -> anyhow::Result<(Guard, std::net::SocketAddr, String)> {
    let refused = refused_port();
    let dead = format!("http://127.0.0.1:{}", refused.port);
    let mut args = vec!["--upstream", &dead, "--admin-listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let guard = Guard::start(&args).await?;
    let admin = admin_base(&guard).await?;
    let address = admin.trim_start_matches("http://").parse()?;
    Ok((guard, address, admin))
}

/// `GET /healthz` on a fresh connection, answered `200` within `within` (a
/// liveness probe's patience).
async fn probe(admin: &str, within: Duration, behind: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let healthz = tokio::time::timeout(within, get(&format!("{admin}/healthz"))).await;
    println!("/healthz after {:?} behind {behind}", started.elapsed());
    let (status, _) = healthz
        .with_context(|| format!("/healthz unanswered for {within:?} behind {behind}"))??;
    assert_eq!(status, 200);
    Ok(())
}

/// At default settings, `--admin-max-connections` (16) idle keep-alive
/// connections, each answered once, held `/healthz` unanswered for the
/// keep-alive timeout (75 s), and their client simply opened them again.
/// Now an idle connection is closed to make room for a new one at the cap,
/// as nginx closes its idle keep-alive connections when it runs out.
#[tokio::test]
async fn idle_admin_connections_make_room_at_the_cap() -> anyhow::Result<()> {
    let (_guard, address, admin) = admin_guard(&[]).await?;
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    let mut idle = Vec::new();
    for _ in 0..16 {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(healthz).await?;
        let mut head = [0u8; 12];
        tokio::time::timeout(OK_TIMEOUT, stream.read_exact(&mut head)).await??;
        assert_eq!(&head, b"HTTP/1.1 200");
        idle.push(stream);
    }
    probe(
        &admin,
        Duration::from_secs(3),
        "16 idle keep-alive connections",
    )
    .await
}

/// At default settings, 16 connections pipelining requests and never
/// reading held `/healthz` unanswered for the client send timeout (60 s).
/// The admin listener's own send timeout (`--admin-send-timeout`, a couple
/// of seconds) cuts them well within a probe's patience.
#[tokio::test]
async fn unread_admin_connections_lose_their_slot_in_seconds() -> anyhow::Result<()> {
    let (_guard, address, admin) = admin_guard(&[]).await?;
    let attackers = 16;
    let (accepted, mut answered) = tokio::sync::mpsc::channel(attackers);
    let mut attacks = JoinSet::new();
    for _ in 0..attackers {
        attacks.spawn(unread_pipeline(address, accepted.clone()));
    }
    for _ in 0..attackers {
        tokio::time::timeout(OK_TIMEOUT, answered.recv())
            .await
            .context("an attacking connection was never served")?;
    }
    // The admin send timeout (2 s), after the few milliseconds it takes to
    // fill the socket buffers, plus room for a loaded machine.
    let probed = probe(
        &admin,
        Duration::from_secs(5),
        "16 unread pipelining connections",
    )
    .await;
    attacks.abort_all();
    probed
}

/// At default settings, 16 connections each part-way through a request
/// head (a slow-head client) are not idle and cannot make room: they held
/// `/healthz` unanswered for the head timeout (`--header-read-timeout`,
/// 10 s). The admin listener's own head timeout (`--admin-header-read-timeout`,
/// a couple of seconds) cuts them within a probe's patience.
#[tokio::test]
async fn slow_admin_heads_lose_their_slot_in_seconds() -> anyhow::Result<()> {
    let (_guard, address, admin) = admin_guard(&[]).await?;
    let mut slow = Vec::new();
    for _ in 0..16 {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(b"GET /healthz HTTP/1.1\r\n").await?;
        slow.push(stream);
    }
    // The admin head timeout (2 s), plus room for a loaded machine.
    probe(
        &admin,
        Duration::from_secs(5),
        "16 connections part-way through a request head",
    )
    .await
}

/// `--admin-max-connections` bounds the admin connections open at once: with
/// 2, a third connection is served only as the one of two idle connections
/// that was idle the longer is closed to make room for it.
#[tokio::test]
async fn admin_connections_are_capped_by_the_operator() -> anyhow::Result<()> {
    let (_guard, address, _) = admin_guard(&["--admin-max-connections", "2"]).await?;
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    let mut head = [0u8; 12];
    // Two kept-alive connections, each answered once (so accepted), and the
    // third: each answer is read whole, up to its body.
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(healthz).await?;
        let mut answer = Vec::new();
        while !answer.ends_with(b"ok\n") {
            let mut chunk = [0u8; 512];
            let n = tokio::time::timeout(OK_TIMEOUT, stream.read(&mut chunk)).await??;
            anyhow::ensure!(n > 0, "closed before its answer");
            answer.extend_from_slice(&chunk[..n]);
        }
        head.copy_from_slice(&answer[..12]);
        assert_eq!(&head, b"HTTP/1.1 200");
        open.push(stream);
    }
    // The first, idle the longest, was closed for the third.
    let mut byte = [0u8; 1];
    let n = tokio::time::timeout(OK_TIMEOUT, open[0].read(&mut byte))
        .await
        .context("no admin connection closed to make room at the cap")??;
    assert_eq!(
        n, 0,
        "the connection closed to make room was not closed cleanly"
    );
    Ok(())
}
