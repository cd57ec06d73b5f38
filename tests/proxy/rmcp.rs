//! The guard proxy in front of an unguarded rmcp 3.11 server that runs as a
//! separate HTTP server on loopback: the server any language could have
//! written, protected without touching it.
//!
//! Controls (client straight to the upstream) show the cross-wire; the same
//! traffic through the proxy gives every caller its own result (Remap) or a
//! clean 400 (Reject). Ordering uses the echo tool's started channel and
//! holds, never sleeps.
use futures::future::join_all;
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use serde_json::json;

use crate::support::client::{Session, Tally};
use crate::support::proxy::{control_burst, sentinels, Outcome, BURST};
use crate::support::server::{serve_proxy, upstream};
use crate::support::wait::drained;
use crate::support::{HANG_TIMEOUT, OK_TIMEOUT};

fn assert_clean_rejection(outcome: &Outcome) {
    assert_eq!(
        *outcome,
        Outcome::Rejected {
            status: 400,
            id: json!(1),
            code: -32600
        }
    );
}

/// Control: 12 concurrent `id: 1` calls straight to the bare rmcp server (the
/// issue's burst, with staggered work times): at least one caller gets
/// another's result or no answer.
#[tokio::test]
async fn control_burst_straight_to_the_upstream_cross_wires() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let session = Session::open(&rmcp.url).await?;
    control_burst(&session, "direct to rmcp").await
}

/// Remap through the proxy: all 12 calls provably in flight at the upstream
/// at once (each held until all started); every caller gets its own result
/// with id 1, eleven were remapped, and the table drains.
#[tokio::test]
async fn remap_burst_through_the_proxy_gives_everyone_their_own_result() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&rmcp.base, &guard).await?;
    let session = Session::open(&format!("http://{}/mcp", proxy.addr)).await?;
    let names = sentinels("remap");
    for sentinel in &names {
        rmcp.gates.hold(sentinel);
    }
    let calls = join_all(
        names
            .iter()
            .map(|sentinel| session.echo(json!(1), sentinel, 0, OK_TIMEOUT)),
    );
    let release = async {
        rmcp.wait_started(&names).await?;
        assert_eq!(guard.stats().in_flight_requests, BURST);
        for sentinel in &names {
            rmcp.gates.release(sentinel);
        }
        anyhow::Ok(())
    };
    let (outcomes, released) = tokio::join!(calls, release);
    released?;
    let tally = Tally::of(&outcomes);
    println!("remap burst through the proxy: {tally:?}");
    assert_eq!(tally.own, BURST, "{outcomes:?}");
    let stats = drained(&guard).await?;
    assert_eq!((stats.passed_total, stats.remapped_total), (1, 11));
    Ok(())
}

/// Reject through the proxy: while the one admitted call is held at the
/// upstream, the other eleven get clean 400s with id 1 and -32600; once
/// released, the admitted one gets its own result.
#[tokio::test]
async fn reject_burst_through_the_proxy_gives_clean_400s() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let proxy = serve_proxy(&rmcp.base, &guard).await?;
    let session = Session::open(&format!("http://{}/mcp", proxy.addr)).await?;
    let names = sentinels("reject");
    for sentinel in &names {
        rmcp.gates.hold(sentinel);
    }
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for sentinel in names.clone() {
        let session = session.clone();
        let done = done_tx.clone();
        tokio::spawn(async move {
            let outcome = session.echo(json!(1), &sentinel, 0, OK_TIMEOUT).await;
            let _ = done.send((sentinel, outcome));
        });
    }
    // Eleven answers come back while one call is still held.
    let mut rejected = 0;
    while rejected < BURST - 1 {
        let (sentinel, outcome) = tokio::time::timeout(OK_TIMEOUT, done_rx.recv())
            .await?
            .expect("senders alive");
        assert_clean_rejection(&outcome);
        let _ = sentinel;
        rejected += 1;
    }
    let admitted = rmcp.started_so_far().await;
    assert_eq!(admitted.len(), 1, "only one call reached the server");
    rmcp.gates.release(&admitted[0]);
    let (sentinel, outcome) = tokio::time::timeout(OK_TIMEOUT, done_rx.recv())
        .await?
        .expect("senders alive");
    assert_eq!((sentinel, outcome), (admitted[0].clone(), Outcome::Own));
    println!("reject burst through the proxy: 1 own result, {rejected} rejected with 400");
    let stats = drained(&guard).await?;
    assert_eq!((stats.passed_total, stats.rejected_total), (1, 11));
    Ok(())
}

/// Control, pair case: A (held in the tool) and B, both id 1, straight to the
/// bare server. B is released first, then A; at least one of them gets the
/// wrong result or no answer.
#[tokio::test]
async fn control_pair_straight_to_the_upstream_cross_wires() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let session = Session::open(&rmcp.url).await?;
    rmcp.gates.hold("A");
    rmcp.gates.hold("B");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "A", 0, HANG_TIMEOUT).await }
    });
    rmcp.wait_started(&["A"]).await?;
    let b = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "B", 0, HANG_TIMEOUT).await }
    });
    // If B never reaches the tool, that is the bug too; don't wait forever.
    let b_started = rmcp.wait_started(&["B"]).await.is_ok();
    rmcp.gates.release("B");
    let b = b.await?;
    rmcp.gates.release("A");
    let a = a.await?;
    println!("control pair (direct): A = {a:?}, B = {b:?}, B reached the tool: {b_started}");
    assert!(
        a != Outcome::Own || b != Outcome::Own,
        "the bare server did not cross-wire"
    );
    Ok(())
}

/// Remap, pair case through the proxy: A held, B sent once A started; B is
/// answered first, then A; both get their own results with id 1.
#[tokio::test]
async fn remap_pair_through_the_proxy() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&rmcp.base, &guard).await?;
    let session = Session::open(&format!("http://{}/mcp", proxy.addr)).await?;
    rmcp.gates.hold("A");
    rmcp.gates.hold("B");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "A", 0, OK_TIMEOUT).await }
    });
    rmcp.wait_started(&["A"]).await?;
    let b = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "B", 0, OK_TIMEOUT).await }
    });
    rmcp.wait_started(&["B"]).await?;
    rmcp.gates.release("B");
    assert_eq!(b.await?, Outcome::Own);
    rmcp.gates.release("A");
    assert_eq!(a.await?, Outcome::Own);
    let stats = drained(&guard).await?;
    assert_eq!((stats.passed_total, stats.remapped_total), (1, 1));
    Ok(())
}

/// Reject, pair case through the proxy: B gets a clean 400 at once and never
/// reaches the server; A gets its own result; then id 1 is free again.
#[tokio::test]
async fn reject_pair_through_the_proxy() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let proxy = serve_proxy(&rmcp.base, &guard).await?;
    let session = Session::open(&format!("http://{}/mcp", proxy.addr)).await?;
    rmcp.gates.hold("A");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "A", 0, OK_TIMEOUT).await }
    });
    rmcp.wait_started(&["A"]).await?;
    let b = session.echo(json!(1), "B", 0, OK_TIMEOUT).await;
    assert_clean_rejection(&b);
    assert_eq!(rmcp.started_so_far().await, ["A"]);
    rmcp.gates.release("A");
    assert_eq!(a.await?, Outcome::Own);
    // Sequential reuse stays allowed.
    drained(&guard).await?;
    assert_eq!(
        session.echo(json!(1), "C", 0, OK_TIMEOUT).await,
        Outcome::Own
    );
    let stats = drained(&guard).await?;
    assert_eq!((stats.passed_total, stats.rejected_total), (2, 1));
    Ok(())
}

/// The guard decides on the request the upstream will see: B, a session
/// POST with `id: 1` claiming revision 2026-07-28 and naming that header in
/// `Connection`, is refused at the proxy while A (`id: 1`) is in flight.
/// Before, the guard judged B sessionless and let it pass untracked; the
/// proxy dropped the header `Connection` named, rmcp read B as a 2025-03-26
/// request of the session, routed it by id 1, and A's answer was lost.
#[tokio::test]
async fn a_connection_header_cannot_hide_a_session_post() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&rmcp.base, &guard).await?;
    let session = Session::open(&format!("http://{}/mcp", proxy.addr)).await?;
    rmcp.gates.hold("A");
    rmcp.gates.hold("B");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "A", 0, OK_TIMEOUT).await }
    });
    rmcp.wait_started(&["A"]).await?;
    let mut b = tokio::spawn({
        let session = session.clone();
        async move {
            let headers = [
                ("mcp-protocol-version", "2026-07-28"),
                ("connection", "keep-alive, MCP-Protocol-Version"),
            ];
            session
                .echo_with(json!(1), "B", 0, OK_TIMEOUT, &headers)
                .await
        }
    });
    // Refused, B ends at once; passed, it is held in the tool.
    let early = tokio::select! {
        outcome = &mut b => Some(outcome?),
        _ = rmcp.wait_started(&["B"]) => None,
    };
    rmcp.gates.release("B");
    let b = match early {
        Some(outcome) => outcome,
        None => b.await?,
    };
    rmcp.gates.release("A");
    let a = a.await?;
    assert_eq!(
        b,
        Outcome::Rejected {
            status: 400,
            id: json!(null),
            code: -32600
        },
        "A got {a:?}"
    );
    assert_eq!(a, Outcome::Own);
    assert_eq!(rmcp.started_so_far().await, ["A"]);
    drained(&guard).await?;
    Ok(())
}

/// A whole session through the proxy: initialize, a standalone GET stream,
/// tools/list, DELETE; afterwards the upstream's own 404 for the ended
/// session passes through unchanged.
#[tokio::test]
async fn session_lifecycle_through_the_proxy() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&rmcp.base, &guard).await?;
    let session = Session::open(&format!("http://{}/mcp", proxy.addr)).await?;

    let stream = tokio::time::timeout(OK_TIMEOUT, session.get_stream().send()).await??;
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");

    let listed = tokio::time::timeout(
        OK_TIMEOUT,
        session
            .post_json(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
            .send(),
    )
    .await??
    .text()
    .await?;
    let listed = crate::support::ids::find_response(&listed).expect("a response");
    assert_eq!(listed["id"], 5);
    assert_eq!(listed["result"]["tools"][0]["name"], "echo");
    drop(stream);

    let deleted = tokio::time::timeout(OK_TIMEOUT, session.delete().send()).await??;
    assert!(
        deleted.status().is_success(),
        "DELETE: {}",
        deleted.status()
    );

    let after = tokio::time::timeout(
        OK_TIMEOUT,
        session
            .post_json(json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list"}))
            .send(),
    )
    .await??;
    assert_eq!(after.status(), 404);
    drained(&guard).await?;
    Ok(())
}

/// A client that goes away while its call still runs at the server, then the
/// same id again in the session: `B` must get its own result, not `A`'s.
/// rmcp does not read a disconnect as a cancellation, so `A` keeps running
/// under id 1 after the guard released it.
async fn disconnect_then_reuse(guard: IdGuardLayer) -> anyhow::Result<Outcome> {
    let rmcp = upstream().await?;
    let proxy = serve_proxy(&rmcp.base, &guard).await?;
    let session = Session::open(&format!("http://{}/mcp", proxy.addr)).await?;
    rmcp.gates.hold("A");
    rmcp.gates.hold("B");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "A", 0, OK_TIMEOUT).await }
    });
    rmcp.wait_started(&["A"]).await?;
    // A's client goes away: its connection closes mid-response.
    a.abort();
    let _ = a.await;
    drained(&guard).await?;

    let b = tokio::spawn({
        let session = session.clone();
        async move { session.echo(json!(1), "B", 0, HANG_TIMEOUT).await }
    });
    rmcp.wait_started(&["B"]).await?;
    rmcp.gates.release("A");
    rmcp.wait_started(&["finished:A"]).await?;
    rmcp.gates.release("B");
    let b = b.await?;
    drained(&guard).await?;
    Ok(b)
}

/// With `rewrite_all_ids`, the server never sees an id twice, so an orphaned
/// call cannot answer a later one.
#[tokio::test]
async fn disconnect_then_reuse_with_rewrite_all_ids_is_safe() -> anyhow::Result<()> {
    let b = disconnect_then_reuse(IdGuardLayer::new().rewrite_all_ids(true)).await?;
    assert_eq!(b, Outcome::Own);
    Ok(())
}

/// With the default settings, after A's client disconnects the id is free for
/// the client but shadowed: B reaches the server with a server-side id while
/// A still runs there under id 1, so B gets its own result, not A's.
#[tokio::test]
async fn disconnect_then_reuse_with_defaults() -> anyhow::Result<()> {
    let b = disconnect_then_reuse(IdGuardLayer::new()).await?;
    assert_eq!(b, Outcome::Own);
    Ok(())
}
