//! End-to-end tests against a real rmcp 3.11 streamable-HTTP server (stateful
//! mode) over loopback, with a real HTTP client, one session per test.
//!
//! The bare-server tests are controls: they show the harness can see the bug
//! (a cross-wired result or a hung call). The guarded tests show the layer
//! removes it under both policies. Ordering between client and server uses the
//! echo tool's started signals and hold gates, never sleeps; every wait is
//! bounded.

use std::time::Duration;

use http::StatusCode;
use mcp_id_guard::{IdGuardLayer, OnDuplicate};

use crate::support::client::{burst, burst_delay, pair, Call, Outcome, Report, Session, Tally};
use crate::support::ids::raw_id;
use crate::support::server::{serve, McpServer};
use crate::support::wait::{assert_released, is_drained, stats_when};
use crate::support::{HANG_TIMEOUT, OK_TIMEOUT, WAIT_TIMEOUT};

const BURST: usize = 12;

/// Asserts that a call got its own result, with exactly the id text it sent,
/// that its response stream ended, and that no server-side id reached it.
#[track_caller]
fn assert_own(report: &Report) {
    crate::support::client::assert_own(report);
    assert!(
        report.exchange.ended,
        "{}: the response stream must end after the response: {report:#?}",
        report.sentinel
    );
    assert!(
        !report.exchange.body.contains("mcp-id-guard:"),
        "{}: no server-side id may reach the client: {}",
        report.sentinel,
        report.exchange.body
    );
}

/// Asserts that a call was answered by the guard with `status`,
/// `Content-Type: application/json` and a JSON-RPC `-32600` error carrying
/// exactly the id text it sent.
#[track_caller]
fn assert_rejected(report: &Report, expected_status: StatusCode) {
    let Outcome::Rejected {
        status,
        content_type,
        body,
    } = &report.outcome
    else {
        panic!("{}: expected a rejection, got {report:#?}", report.sentinel);
    };
    assert_eq!(*status, expected_status.as_u16(), "{report:#?}");
    assert_eq!(content_type.as_deref(), Some("application/json"));
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert_eq!(
        raw_id(&report.exchange.body).as_deref(),
        Some(report.sent_id.as_str()),
        "the rejection carries exactly the id sent: {}",
        report.exchange.body
    );
}

/// Whether a call was answered by the guard with `400` and a well-formed
/// `-32600` error carrying the id sent.
fn is_clean_rejection(report: &Report) -> bool {
    matches!(
        &report.outcome,
        Outcome::Rejected { status: 400, content_type: Some(ct), body }
            if ct == "application/json"
                && body["error"]["code"] == -32600
                && raw_id(&report.exchange.body).as_deref() == Some(report.sent_id.as_str())
    )
}

// ---------------------------------------------------------------------------
// (a) Controls: the bare server shows the bug
// ---------------------------------------------------------------------------

/// Control: on a bare rmcp server, 12 concurrent `tools/call` with `id: 1` in
/// one session do not all get their own result: at least one call receives
/// another call's result or no answer within the hang timeout. Proves the
/// harness can see the bug the guard exists for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_burst_with_duplicate_ids_cross_wires_or_hangs() -> anyhow::Result<()> {
    let server = serve(None).await?;
    let client = Session::open(&server.url).await?;
    let reports = burst(&client, "bare-burst", "1", BURST, HANG_TIMEOUT).await;
    let tally = Tally::of(&reports);
    eprintln!("bare burst, 12 x id 1: {tally}");
    assert!(
        tally.wrong + tally.hung >= 1,
        "the bare server should cross-wire or hang duplicates: {reports:#?}"
    );
    server.stop().await;
    Ok(())
}

/// Control of the control: the same bare burst with distinct ids is clean, so
/// the failures above come from the duplicate ids, not from the harness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_burst_with_unique_ids_is_clean() -> anyhow::Result<()> {
    let server = serve(None).await?;
    let client = Session::open(&server.url).await?;
    let calls: Vec<(String, Call)> = (0..BURST)
        .map(|i| {
            let call = Call::echo(format!("unique-{i:02}"), burst_delay(i, BURST));
            ((100 + i).to_string(), call)
        })
        .collect();
    let reports = futures::future::join_all(
        calls
            .iter()
            .map(|(id, call)| client.call(id, call, OK_TIMEOUT)),
    )
    .await;
    reports.iter().for_each(assert_own);
    server.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// (b) Remap
// ---------------------------------------------------------------------------

/// With the layer (Remap, the default), 12 concurrent calls with `id: 1` each
/// get their own result with exactly `1` as id; afterwards nothing is in
/// flight, no session is tracked, and the counters add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remap_burst_every_call_gets_its_own_result() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    let reports = burst(&client, "remap-burst", "1", BURST, OK_TIMEOUT).await;
    reports.iter().for_each(assert_own);
    let stats = assert_released(&layer).await;
    assert_eq!(stats.passed_total + stats.remapped_total, BURST as u64);
    assert!(stats.remapped_total >= 1, "calls overlapped: {stats:?}");
    assert_eq!(stats.rejected_total, 0);
    server.stop().await;
    Ok(())
}

/// Remap with all 12 calls provably in flight at the server at once (each
/// holds until all have started): exactly one passes with the client's id and
/// eleven are remapped, and every caller still gets its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remap_fully_overlapping_burst_remaps_eleven() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    let calls: Vec<Call> = (0..BURST)
        .map(|i| Call::stubborn(format!("overlap-{i:02}")))
        .collect();
    let tasks: Vec<_> = calls
        .iter()
        .map(|call| {
            let (client, call) = (client.clone(), call.clone());
            tokio::spawn(async move { client.call("1", &call, OK_TIMEOUT).await })
        })
        .collect();
    let sentinels: Vec<&str> = calls.iter().map(|call| call.sentinel.as_str()).collect();
    server
        .started
        .wait_for_all(&sentinels, WAIT_TIMEOUT)
        .await?;
    let during = layer.stats();
    assert_eq!(during.in_flight_requests, BURST, "{during:?}");
    assert_eq!(during.in_flight_sessions, 1, "{during:?}");
    for sentinel in &sentinels {
        server.gates.release(sentinel);
    }
    for task in tasks {
        assert_own(&task.await?);
    }
    let stats = assert_released(&layer).await;
    assert_eq!((stats.passed_total, stats.remapped_total), (1, 11));
    server.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// (c) Reject
// ---------------------------------------------------------------------------

/// Reject, deterministic: while call 0 (`id: 1`) is held in the tool, 11 more
/// calls with `id: 1` each get `400`, `application/json` and
/// `{"jsonrpc":"2.0","id":1,"error":{"code":-32600,..}}` without reaching the
/// server; once released, call 0 gets its own result. Nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_duplicates_of_a_held_call() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    let first = Call::stubborn("reject-held-00");
    let first_task = tokio::spawn({
        let (client, first) = (client.clone(), first.clone());
        async move { client.call("1", &first, OK_TIMEOUT).await }
    });
    server
        .started
        .wait_for(&first.sentinel, WAIT_TIMEOUT)
        .await?;

    let others: Vec<Call> = (1..BURST)
        .map(|i| Call::echo(format!("reject-held-{i:02}"), 0))
        .collect();
    let reports =
        futures::future::join_all(others.iter().map(|call| client.call("1", call, OK_TIMEOUT)))
            .await;
    for report in &reports {
        assert_rejected(report, StatusCode::BAD_REQUEST);
    }
    assert_eq!(
        server.started.seen().await,
        [first.sentinel.as_str()],
        "rejected calls never reach the server"
    );

    server.gates.release(&first.sentinel);
    assert_own(&first_task.await?);
    let stats = assert_released(&layer).await;
    assert_eq!(
        (
            stats.passed_total,
            stats.remapped_total,
            stats.rejected_total
        ),
        (1, 0, 11)
    );
    server.stop().await;
    Ok(())
}

/// Reject, unsynchronised burst: 12 concurrent calls with `id: 1`; every call
/// gets either its own result or a clean `400`/`-32600` carrying `1`, never
/// another call's result and never silence, and the counters match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_burst_is_own_result_or_clean_rejection() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    let reports = burst(&client, "reject-burst", "1", BURST, OK_TIMEOUT).await;
    for report in &reports {
        assert!(
            report.is_clean_own() || is_clean_rejection(report),
            "own result or clean rejection expected: {report:#?}"
        );
    }
    let tally = Tally::of(&reports);
    assert!(tally.own >= 1, "{tally}");
    let stats = assert_released(&layer).await;
    assert_eq!(stats.passed_total, tally.own as u64, "{stats:?}");
    assert_eq!(stats.rejected_total, tally.rejected as u64, "{stats:?}");
    assert_eq!(stats.remapped_total, 0);
    server.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// (d) The pair case: A held, B sent once A has started, both `id: 1`
// ---------------------------------------------------------------------------

/// Control: on the bare server, B (sent while A is in the tool, same id)
/// receives A's result or A never gets an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_pair_cross_wires() -> anyhow::Result<()> {
    let server = serve(None).await?;
    let client = Session::open(&server.url).await?;
    let (a, b) = pair(
        &server,
        &client,
        "bare-pair",
        ("1", "1"),
        true,
        HANG_TIMEOUT,
    )
    .await?;
    eprintln!("bare pair: A {:?}, B {:?}", a.outcome, b.outcome);
    let b_got_a = b.outcome
        == Outcome::Wrong {
            got: a.sentinel.clone(),
        };
    assert!(
        b_got_a || a.outcome == Outcome::Hung,
        "the bare server should cross-wire the pair: A {a:#?}\nB {b:#?}"
    );
    server.stop().await;
    Ok(())
}

/// Remap: A and B both get their own results, both with id `1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remap_pair_both_get_their_own_results() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    let (a, b) = pair(&server, &client, "remap-pair", ("1", "1"), true, OK_TIMEOUT).await?;
    assert_own(&a);
    assert_own(&b);
    let stats = assert_released(&layer).await;
    assert_eq!((stats.passed_total, stats.remapped_total), (1, 1));
    server.stop().await;
    Ok(())
}

/// Reject: B gets `400` with `-32600` and id `1` and never reaches the
/// server; A gets its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_pair_rejects_the_second() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    let (a, b) = pair(
        &server,
        &client,
        "reject-pair",
        ("1", "1"),
        false,
        OK_TIMEOUT,
    )
    .await?;
    assert_own(&a);
    assert_rejected(&b, StatusCode::BAD_REQUEST);
    assert_eq!(server.started.seen().await, [a.sentinel.as_str()]);
    let stats = assert_released(&layer).await;
    assert_eq!((stats.passed_total, stats.rejected_total), (1, 1));
    server.stop().await;
    Ok(())
}

/// `.reject_status(409)`: the duplicate in the pair case gets `409 Conflict`
/// (same JSON-RPC body); A is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_pair_with_conflict_status() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new()
        .on_duplicate(OnDuplicate::Reject)
        .reject_status(StatusCode::CONFLICT);
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    let (a, b) = pair(
        &server,
        &client,
        "conflict-pair",
        ("1", "1"),
        false,
        OK_TIMEOUT,
    )
    .await?;
    assert_own(&a);
    assert_rejected(&b, StatusCode::CONFLICT);
    assert_released(&layer).await;
    server.stop().await;
    Ok(())
}

/// Remap, ids `1` and `"1"` (in both orders): they collide under the crate's
/// equivalence rule, so the second is remapped, and each client gets back
/// exactly the id text it sent (`1` or `"1"`) with its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remap_pair_number_and_string_ids() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    let (a, b) = pair(
        &server,
        &client,
        "mixed-1",
        ("1", r#""1""#),
        true,
        OK_TIMEOUT,
    )
    .await?;
    assert_own(&a);
    assert_own(&b);
    assert_eq!(b.answered_id.as_deref(), Some(r#""1""#));
    let (c, d) = pair(
        &server,
        &client,
        "mixed-2",
        (r#""1""#, "1"),
        true,
        OK_TIMEOUT,
    )
    .await?;
    assert_own(&c);
    assert_own(&d);
    assert_eq!(c.answered_id.as_deref(), Some(r#""1""#));
    assert_eq!(d.answered_id.as_deref(), Some("1"));
    let stats = assert_released(&layer).await;
    assert_eq!(
        (stats.passed_total, stats.remapped_total),
        (2, 2),
        "1 and \"1\" collide: {stats:?}"
    );
    server.stop().await;
    Ok(())
}

/// rmcp 3.11 itself keys ids by `NumberOrString`, so on the bare server `1`
/// and `"1"` in flight together do not collide: both get their own result.
/// (The guard's wider equivalence is for servers that route by `str(id)`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_pair_number_and_string_ids_do_not_collide_in_rmcp() -> anyhow::Result<()> {
    let server = serve(None).await?;
    let client = Session::open(&server.url).await?;
    let (a, b) = pair(
        &server,
        &client,
        "bare-mixed",
        ("1", r#""1""#),
        true,
        OK_TIMEOUT,
    )
    .await?;
    assert_own(&a);
    assert_own(&b);
    server.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// (e) Sequential reuse
// ---------------------------------------------------------------------------

/// Reject allows sequential reuse: five calls with `id: 1`, each sent after
/// the previous response has ended, all get their own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_allows_sequential_reuse() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let client = Session::open(&server.url).await?;
    for i in 0..5 {
        let call = Call::echo(format!("sequential-{i}"), 0);
        assert_own(&client.call("1", &call, OK_TIMEOUT).await);
    }
    let stats = assert_released(&layer).await;
    assert_eq!((stats.passed_total, stats.rejected_total), (5, 0));
    server.stop().await;
    Ok(())
}

/// A client may reuse an id once it has received the response (spec
/// 2026-07-28 wording: ids must not match a request "not yet received a
/// response for"), and the SSE stream's end trails the response event. Under
/// Reject the guard watches the stream for the response and frees the id as
/// it passes. Six sessions each make 150 back-to-back `id: 1` calls under
/// Reject, moving on as soon as the response event arrives; every call gets
/// its own result (before the guard watched for responses, a few in a
/// thousand got a spurious 400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_allows_reuse_right_after_the_response_event() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let mut sessions = Vec::new();
    for session in 0..6 {
        let client = Session::open(&server.url).await?;
        sessions.push(async move {
            let mut reports = Vec::new();
            for i in 0..150 {
                let call = Call::echo(format!("eager-{session}-{i:03}"), 0);
                reports.push(client.call_eager("1", &call, OK_TIMEOUT).await);
            }
            reports
        });
    }
    let reports: Vec<Report> = futures::future::join_all(sessions)
        .await
        .into_iter()
        .flatten()
        .collect();
    let tally = Tally::of(&reports);
    let first_bad = reports.iter().find(|report| report.outcome != Outcome::Own);
    assert_eq!(tally.own, reports.len(), "{tally}; first: {first_bad:#?}");
    assert_released(&layer).await;
    server.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// Resumed streams
// ---------------------------------------------------------------------------

/// Remap and stream resumption: B (a duplicate of A's id, so remapped) loses
/// its POST stream after rmcp's priming event; the client resumes it with
/// `GET` + `Last-Event-ID`, and B's result arrives on the GET stream with
/// exactly the id B sent (`1`, or `"1"`), no server-side id leaking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remap_restores_the_id_on_a_resumed_get_stream() -> anyhow::Result<()> {
    for id_b in ["1", r#""1""#] {
        let layer = IdGuardLayer::new();
        let server = serve(Some(layer.clone())).await?;
        let client = Session::open(&server.url).await?;
        let a = Call::stubborn("resume-A");
        let task_a = tokio::spawn({
            let (client, a) = (client.clone(), a.clone());
            async move { client.call("1", &a, OK_TIMEOUT).await }
        });
        server.started.wait_for(&a.sentinel, WAIT_TIMEOUT).await?;

        let b = Call::stubborn("resume-B");
        let event_id = client.start_echo_then_drop(id_b, &b).await?;
        server.started.wait_for(&b.sentinel, WAIT_TIMEOUT).await?;
        // Attach the resumed stream before B answers: rmcp 3.11 does not
        // replay an answer produced while no stream was attached.
        let resumed = client.resume(&event_id, OK_TIMEOUT).await?;
        assert_eq!(resumed.status(), Some(200));
        server.gates.release(&b.sentinel);
        let report_b = Report::classify(id_b, &b.sentinel, resumed.read_response().await);
        assert_eq!(report_b.outcome, Outcome::Own, "{report_b:#?}");
        assert_eq!(report_b.answered_id.as_deref(), Some(id_b));
        assert!(
            !report_b.exchange.body.contains("mcp-id-guard:"),
            "{}",
            report_b.exchange.body
        );

        server.gates.release(&a.sentinel);
        assert_own(&task_a.await?);
        let stats = assert_released(&layer).await;
        assert_eq!((stats.passed_total, stats.remapped_total), (1, 1));
        assert!(stats.restored_total >= 1, "{stats:?}");
        server.stop().await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// (f) Ids the server may still answer: the client gave up on the first call
// ---------------------------------------------------------------------------
//
// rmcp 3.11 keeps running a request whose client disconnected (the spec says
// a disconnect is not a cancellation), and a cancelled tool that ignores its
// cancellation token still answers; rmcp routes that late answer by id to
// whichever request holds the id by then.

/// How long a late answer for an abandoned request gets to be cross-wired onto
/// a waiting call before that call is let out: only the no-bug path waits it
/// out; a cross-wire ends the waiting call within milliseconds.
const CROSS_WIRE_GRACE: Duration = Duration::from_secs(1);

/// How the first call (`id: 1`, held in the tool) is given up on.
#[derive(Debug, Clone, Copy)]
enum GiveUp {
    /// The client drops its POST (closes the connection).
    Disconnect,
    /// The client sends `notifications/cancelled` for `1`.
    Cancel,
}

/// A (`id: 1`) is held in the tool; the client gives up on it; once the guard
/// (if any) has let go of A, C (`id: 1`, held) is sent; once C has started,
/// A's tool finishes, and C's only after A's answer had its chance to land on
/// C. Returns what C got.
async fn give_up_then_reuse(
    server: &McpServer,
    layer: Option<&IdGuardLayer>,
    how: GiveUp,
) -> anyhow::Result<Report> {
    let client = Session::open(&server.url).await?;
    let a = Call::stubborn("gave-up-A");
    let task_a = tokio::spawn({
        let (client, a) = (client.clone(), a.clone());
        async move { client.call("1", &a, OK_TIMEOUT).await }
    });
    server.started.wait_for(&a.sentinel, WAIT_TIMEOUT).await?;
    match how {
        GiveUp::Disconnect => task_a.abort(),
        GiveUp::Cancel => {
            let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"gave up"}}"#;
            let answer = client.post(cancel.to_owned(), OK_TIMEOUT).await;
            assert_eq!(answer.status, Some(202), "{answer:?}");
            // rmcp has cancelled A's handler context (the tool goes on).
            server
                .started
                .wait_for(&format!("cancelled:{}", a.sentinel), WAIT_TIMEOUT)
                .await?;
        }
    }
    if let Some(layer) = layer {
        // The guard lets go of A when A's response stream ends or is dropped
        // (or, for a cancel, at once); give it a bounded chance to.
        let stats = stats_when(layer, Duration::from_secs(2), is_drained).await;
        eprintln!("{how:?}: guard after giving up on A: {stats:?}");
    }

    let c = Call::stubborn("reused-C");
    let mut task_c = tokio::spawn({
        let (client, c) = (client.clone(), c.clone());
        async move { client.call("1", &c, OK_TIMEOUT).await }
    });
    let report = tokio::select! {
        started = server.started.wait_for(&c.sentinel, WAIT_TIMEOUT) => {
            started?;
            // A's tool finishes first. On a server that routes by id, A's
            // answer lands on C's stream and ends it within moments; give it
            // a bounded chance to before C's own answer is let out.
            server.gates.release(&a.sentinel);
            server
                .started
                .wait_for(&format!("finished:{}", a.sentinel), WAIT_TIMEOUT)
                .await?;
            match tokio::time::timeout(CROSS_WIRE_GRACE, &mut task_c).await {
                Ok(report) => report?,
                Err(_) => {
                    server.gates.release(&c.sentinel);
                    task_c.await?
                }
            }
        }
        // Answered by the guard without reaching the server.
        report = &mut task_c => report?,
    };
    server.gates.release(&a.sentinel);
    Ok(report)
}

/// Control: on the bare server, a call that reuses the id of a call its
/// client disconnected from receives the abandoned call's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_reuse_after_disconnect_gets_the_abandoned_result() -> anyhow::Result<()> {
    let server = serve(None).await?;
    let c = give_up_then_reuse(&server, None, GiveUp::Disconnect).await?;
    assert_eq!(
        c.outcome,
        Outcome::Wrong {
            got: "gave-up-A".into()
        },
        "{c:#?}"
    );
    server.stop().await;
    Ok(())
}

/// Control: on the bare server (rmcp 3.11), a call that reuses the id of a
/// cancelled call whose tool still finishes receives the cancelled call's
/// result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_reuse_after_cancel_gets_the_cancelled_result() -> anyhow::Result<()> {
    let server = serve(None).await?;
    let c = give_up_then_reuse(&server, None, GiveUp::Cancel).await?;
    assert_eq!(
        c.outcome,
        Outcome::Wrong {
            got: "gave-up-A".into()
        },
        "{c:#?}"
    );
    server.stop().await;
    Ok(())
}

/// Runs [`give_up_then_reuse`] for every combination, each on its own server,
/// all at once; returns `(how, policy, what C got)`.
async fn give_up_then_reuse_all(
    policies: &[OnDuplicate],
    rewrite_all_ids: bool,
) -> anyhow::Result<Vec<(GiveUp, OnDuplicate, Report)>> {
    let mut scenarios = Vec::new();
    for how in [GiveUp::Disconnect, GiveUp::Cancel] {
        for &policy in policies {
            scenarios.push(async move {
                let layer = IdGuardLayer::new()
                    .on_duplicate(policy)
                    .rewrite_all_ids(rewrite_all_ids);
                let server = serve(Some(layer.clone())).await?;
                let c = give_up_then_reuse(&server, Some(&layer), how).await?;
                server.stop().await;
                anyhow::Ok((how, policy, c))
            });
        }
    }
    futures::future::join_all(scenarios)
        .await
        .into_iter()
        .collect()
}

/// With `rewrite_all_ids`, the server never sees the client's id, so neither
/// a disconnected nor a cancelled earlier call can take the reused id's
/// place: C gets its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_all_ids_reuse_after_giving_up_gets_its_own_result() -> anyhow::Result<()> {
    let results = give_up_then_reuse_all(&[OnDuplicate::Remap, OnDuplicate::Reject], true).await?;
    for (how, policy, c) in &results {
        assert_eq!(c.outcome, Outcome::Own, "{how:?} {policy:?}: {c:#?}");
        assert_own(c);
    }
    Ok(())
}

/// After a client disconnects or cancels, rmcp may still answer the earlier
/// request under its id. The guard frees the id for the client at once but
/// keeps it shadowed: the reused id goes to the server remapped, so C gets its
/// own result or a clean rejection, never A's result (before shadowing, C got
/// A's result under every policy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_after_giving_up_is_not_cross_wired() -> anyhow::Result<()> {
    let policies = [OnDuplicate::Remap, OnDuplicate::Reject, OnDuplicate::Queue];
    let failures: Vec<String> = give_up_then_reuse_all(&policies, false)
        .await?
        .into_iter()
        .filter(|(_, _, c)| {
            !(c.outcome == Outcome::Own || matches!(c.outcome, Outcome::Rejected { .. }))
        })
        .map(|(how, policy, c)| format!("{how:?} {policy:?}: C got {:?}", c.outcome))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
    Ok(())
}

/// rmcp reads the ids `1.0`, `1e0` and `10e-1` as the integer 1.
const SPELLINGS_OF_ONE: [&str; 3] = ["1.0", "1e0", "10e-1"];

/// Control: bare, a request whose id is another spelling of 1 cross-wires
/// with a held `1` (B gets A's result or A never gets an answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn number_spellings_of_one_id_cross_wire_bare() -> anyhow::Result<()> {
    let server = serve(None).await?;
    let pairs = futures::future::join_all(SPELLINGS_OF_ONE.map(|spelling| {
        let server = &server;
        async move {
            let client = Session::open(&server.url).await?;
            let tag = format!("bare-{spelling}");
            pair(server, &client, &tag, ("1", spelling), true, HANG_TIMEOUT).await
        }
    }))
    .await;
    for (spelling, pair) in SPELLINGS_OF_ONE.iter().zip(pairs) {
        let (a, b) = pair?;
        let b_got_a = b.outcome
            == Outcome::Wrong {
                got: a.sentinel.clone(),
            };
        assert!(
            b_got_a || a.outcome == Outcome::Hung,
            "{spelling}: the bare server should cross-wire: A {a:#?}\nB {b:#?}"
        );
    }
    server.stop().await;
    Ok(())
}

/// Through the guard, every spelling of 1 is the id 1: the second request is
/// remapped, both get their own results, and B gets its id back exactly as
/// it wrote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn number_spellings_of_one_id_are_one_id_through_the_guard() -> anyhow::Result<()> {
    for spelling in SPELLINGS_OF_ONE {
        let layer = IdGuardLayer::new();
        let server = serve(Some(layer.clone())).await?;
        let client = Session::open(&server.url).await?;
        let tag = format!("guarded-{spelling}");
        let (a, b) = pair(&server, &client, &tag, ("1", spelling), true, OK_TIMEOUT).await?;
        assert_own(&a);
        assert_own(&b);
        let stats = assert_released(&layer).await;
        assert_eq!(
            (stats.passed_total, stats.remapped_total),
            (1, 1),
            "{spelling}"
        );
        server.stop().await;
    }
    Ok(())
}
