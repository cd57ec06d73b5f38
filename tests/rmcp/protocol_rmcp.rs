//! Issue #4 against the real rmcp 3.11 (stateful streamable HTTP) over
//! loopback, with a real HTTP client and one session per test (two where
//! sessions are compared): cancellation, resumed and replayed `GET` streams,
//! the `Queue` policy, and several guard replicas in front of one server.
//!
//! The probe tool records on the server's own log when each call started, when
//! its `RequestContext::ct` fired and when it finished; the handler also logs
//! every `notifications/cancelled` it receives, and a tap between the guard and
//! rmcp records the bytes rmcp received. Ordering uses that log, hold gates and
//! bounded polls of the guard's counters, never sleeps; every wait is bounded.
//!
//! What rmcp 3.11 does with a cancellation (stateful mode), as these tests
//! observe it: the session worker closes the cancelled request's POST stream at
//! once (the SSE body ends, no JSON-RPC response is sent), the serve loop fires
//! the request's `ct` and forgets the request, and the handler's eventual
//! result is dropped, unless by then another request with the same id has
//! taken its slot (see the `late_result_*` tests).

use std::time::Duration;

use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use tokio::task::JoinHandle;

use crate::support::client::{assert_own, classify_response, Call, Outcome, Report, Session};
use crate::support::ids::raw_id;
use crate::support::server::{serve, serve_with, McpServer, Setup};
use crate::support::wait::{assert_released, stats_when};
use crate::support::{HANG_TIMEOUT, OK_TIMEOUT, WAIT_TIMEOUT};

const BURST: usize = 12;

/// Sends a call in the background.
fn spawn_call(session: &Session, id: &str, call: &Call, within: Duration) -> JoinHandle<Report> {
    let (session, id, call) = (session.clone(), id.to_owned(), call.clone());
    tokio::spawn(async move { session.call(&id, &call, within).await })
}

/// Awaits a background call (its own deadline bounds it).
async fn finish(task: JoinHandle<Report>) -> Report {
    task.await.expect("the call task panicked")
}

/// Sends a held call and waits until the server's tool has started it.
async fn start_held(
    server: &McpServer,
    session: &Session,
    id: &str,
    call: &Call,
) -> anyhow::Result<JoinHandle<Report>> {
    let task = spawn_call(session, id, call, OK_TIMEOUT);
    server
        .log
        .wait_for(&format!("started:{}", call.sentinel), WAIT_TIMEOUT)
        .await?;
    Ok(task)
}

/// A round trip with a fresh id once a cancelled call's handler has returned.
/// rmcp carries handler results to its serve loop on one FIFO channel, and
/// the handler's result went in ahead of the ping's; once the ping is answered,
/// rmcp has dealt with that result (dropped it, or delivered it: see the
/// `late_result_*` tests) before any later request with the same id arrives.
async fn settle(session: &Session, sentinel: &str) {
    let ping = session
        .call("9000", &Call::new(sentinel, 0), OK_TIMEOUT)
        .await;
    assert_own(&ping);
}

/// Asserts a cancelled call's POST stream ended without any JSON-RPC response
/// (rmcp closes it at the cancellation and sends nothing).
#[track_caller]
fn assert_ended_without_response(report: &Report) {
    assert_eq!(
        report.outcome,
        Outcome::EndedWithoutResponse,
        "{}: a cancelled call gets no response and its stream ends: {report:#?}",
        report.sentinel
    );
    assert_eq!(report.exchange.status, Some(200));
}

/// Asserts the guard refused a call with `status` and a JSON-RPC error with
/// `code` carrying exactly the id text sent.
#[track_caller]
fn assert_refused(report: &Report, status: u16, code: i64) {
    assert!(
        matches!(report.outcome, Outcome::Rejected { status: got, .. } if got == status),
        "{}: {report:#?}",
        report.sentinel
    );
    let body = report.exchange.json();
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert_eq!(
        raw_id(&report.exchange.body).as_deref(),
        Some(report.sent_id.as_str()),
        "the guard's answer carries exactly the id sent: {}",
        report.exchange.body
    );
}

/// The `requestId` JSON text of a `notifications/cancelled` body.
fn request_id_of(body: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "requestId")]
        request_id: &'a serde_json::value::RawValue,
    }
    #[derive(serde::Deserialize)]
    struct Notification<'a> {
        method: &'a str,
        #[serde(borrow)]
        params: Params<'a>,
    }
    let notification: Notification<'_> = serde_json::from_str(body).ok()?;
    (notification.method == "notifications/cancelled")
        .then(|| notification.params.request_id.get().to_owned())
}

/// The cancellation bodies rmcp received, in order.
fn cancellations_seen(server: &McpServer) -> Vec<String> {
    server
        .tap
        .posted()
        .into_iter()
        .filter(|body| request_id_of(body).is_some())
        .collect()
}

/// The id text rmcp received for the call with `sentinel`.
fn id_seen_for(server: &McpServer, sentinel: &str) -> Option<String> {
    let needle = format!(r#""sentinel":"{sentinel}""#);
    server
        .tap
        .posted()
        .iter()
        .find(|body| body.contains(&needle))
        .and_then(|body| raw_id(body))
}

// ---------------------------------------------------------------------------
// 1. Cancellation
// ---------------------------------------------------------------------------

/// Remap: A (`id: 1`, held) and, once A has started, B (`id: 1`, held, so
/// remapped). `notifications/cancelled {requestId: 1}` cancels A, the oldest:
/// the server fires A's `ct` (`cancelled:A`) and never B's, the guard counts
/// one cancellation, A's stream ends without a response, and B, released,
/// gets its own result with id `1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_under_remap_cancels_the_oldest_and_spares_the_remapped_duplicate(
) -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let (a, b) = (Call::held("remap-A"), Call::held("remap-B"));
    let task_a = start_held(&server, &session, "1", &a).await?;
    let task_b = start_held(&server, &session, "1", &b).await?;
    let before = layer.stats();
    assert_eq!((before.passed_total, before.remapped_total), (1, 1));

    let (_, answer) = session.cancel("1").await;
    assert_eq!(answer.status, Some(202), "{answer:?}");
    assert_eq!(layer.stats().cancelled_total, 1);
    server
        .log
        .wait_for_all(
            &["notified:1", "cancelled:remap-A", "finished:remap-A"],
            WAIT_TIMEOUT,
        )
        .await?;
    assert_ended_without_response(&finish(task_a).await);

    server.gates.release(&b.sentinel);
    assert_own(&finish(task_b).await);
    assert_eq!(
        server.log.of(&a.sentinel),
        ["started", "cancelled", "finished"]
    );
    assert_eq!(
        server.log.of(&b.sentinel),
        ["started", "finished"],
        "B is never cancelled"
    );
    assert_eq!(server.log.notified(), ["1"]);
    let stats = assert_released(&layer).await;
    assert_eq!((stats.cancelled_total, stats.restored_total), (1, 1));
    server.stop().await;
    Ok(())
}

/// Reject: while A (`id: 1`) is held, a duplicate `id: 1` gets `400`
/// (control). After `notifications/cancelled {requestId: 1}` a new `id: 1`
/// call is accepted and gets its own result: the cancellation freed the id for
/// the client at once. Because a cancelled handler may still answer under
/// `1`, the new call reaches the server with a server-side id (remapped, not
/// passed) and its own id is restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_under_reject_frees_the_id_at_once() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let a = Call::held("reject-A");
    let task_a = start_held(&server, &session, "1", &a).await?;
    let duplicate = session
        .call("1", &Call::new("reject-dup", 0), OK_TIMEOUT)
        .await;
    assert_refused(&duplicate, 400, -32600);

    let (_, answer) = session.cancel("1").await;
    assert_eq!(answer.status, Some(202), "{answer:?}");
    assert_eq!(
        layer.stats().cancelled_total,
        1,
        "freed when the notification passed"
    );
    server
        .log
        .wait_for_all(&["cancelled:reject-A", "finished:reject-A"], WAIT_TIMEOUT)
        .await?;
    settle(&session, "reject-ping").await;
    let reuse = session
        .call("1", &Call::new("reject-C", 0), OK_TIMEOUT)
        .await;
    assert_own(&reuse);
    assert_ended_without_response(&finish(task_a).await);
    assert!(!server.log.contains("started:reject-dup"));
    let stats = assert_released(&layer).await;
    assert_eq!(
        (
            stats.passed_total,
            stats.remapped_total,
            stats.rejected_total,
            stats.cancelled_total
        ),
        (2, 1, 1, 1),
        "A and the ping passed, C was remapped past A's shadow"
    );
    server.stop().await;
    Ok(())
}

/// Remap: A (`id: 1`) and B (`id: 1`, remapped), both held. Cancelling `1`
/// twice cancels A, then B: the server fires B's `ct`, which it can only do if
/// the second notification carried B's server-side id. The tap shows rmcp got
/// `requestId` equal to the id it knows B by (a `mcp-id-guard:` string), the
/// handler was notified of exactly that id, and a third cancellation of `1`
/// (nothing left) passes byte for byte and counts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_cancel_reaches_the_remapped_request_by_its_server_side_id() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let (a, b) = (Call::held("twice-A"), Call::held("twice-B"));
    let task_a = start_held(&server, &session, "1", &a).await?;
    let task_b = start_held(&server, &session, "1", &b).await?;
    let b_server_id = id_seen_for(&server, &b.sentinel).expect("rmcp received B");
    assert!(
        b_server_id.starts_with(r#""mcp-id-guard:"#),
        "B was remapped: {b_server_id}"
    );
    assert_eq!(id_seen_for(&server, &a.sentinel).as_deref(), Some("1"));

    let (first, answer) = session.cancel("1").await;
    assert_eq!(answer.status, Some(202));
    // rmcp runs `on_cancelled` in a task of its own: wait for it too, so the
    // handler's record keeps the order of the notifications.
    server
        .log
        .wait_for_all(&["cancelled:twice-A", "notified:1"], WAIT_TIMEOUT)
        .await?;
    assert!(!server.log.contains("cancelled:twice-B"));

    let (second, answer) = session.cancel("1").await;
    assert_eq!(answer.status, Some(202));
    let notified_b = format!("notified:{b_server_id}");
    server
        .log
        .wait_for_all(&["cancelled:twice-B", &notified_b], WAIT_TIMEOUT)
        .await?;
    assert_eq!(layer.stats().cancelled_total, 2);
    assert_eq!(server.log.notified(), ["1".to_owned(), b_server_id.clone()]);
    let seen = cancellations_seen(&server);
    assert_eq!(seen[0], first, "the first passes unchanged");
    assert_eq!(
        request_id_of(&seen[1]).as_deref(),
        Some(b_server_id.as_str()),
        "the second names B's server-side id: {} (sent {second})",
        seen[1]
    );
    assert_ended_without_response(&finish(task_a).await);
    assert_ended_without_response(&finish(task_b).await);

    let (third, answer) = session.cancel("1").await;
    assert_eq!(answer.status, Some(202));
    assert_eq!(
        cancellations_seen(&server).last(),
        Some(&third),
        "nothing left to cancel: passes unchanged"
    );
    let stats = assert_released(&layer).await;
    assert_eq!(stats.cancelled_total, 2);
    server.stop().await;
    Ok(())
}

/// A `requestId` that matches nothing in flight (`2`, while `1` is held)
/// passes byte for byte (the tap), reaches the server handler
/// (`notified:2`), moves no counter, and cancels nothing: the held `1` is
/// still tracked (a duplicate is still rejected) and, released, gets its own
/// result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_matching_nothing_passes_unchanged() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let a = Call::held("nothing-A");
    let task_a = start_held(&server, &session, "1", &a).await?;
    let before = layer.stats();

    let (sent, answer) = session.cancel("2").await;
    assert_eq!(answer.status, Some(202), "{answer:?}");
    assert_eq!(layer.stats(), before, "no counter moves");
    server.log.wait_for("notified:2", WAIT_TIMEOUT).await?;
    assert_eq!(cancellations_seen(&server), [sent], "passed byte for byte");

    let duplicate = session
        .call("1", &Call::new("nothing-dup", 0), OK_TIMEOUT)
        .await;
    assert_refused(&duplicate, 400, -32600);
    server.gates.release(&a.sentinel);
    assert_own(&finish(task_a).await);
    assert_eq!(server.log.of(&a.sentinel), ["started", "finished"]);
    let stats = assert_released(&layer).await;
    assert_eq!((stats.cancelled_total, stats.rejected_total), (0, 1));
    server.stop().await;
    Ok(())
}

/// Two sessions X and Y each hold a call with `id: 1` (Reject). Cancelling
/// `1` in X cancels X's call only: Y's call is not cancelled, Y's id `1` is
/// still taken (a duplicate in Y gets `400`), while X can reuse `1` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_one_session_leaves_another_session_alone() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let x = Session::open(server.url()).await?;
    let y = Session::open(server.url()).await?;
    let (xa, ya) = (Call::held("session-X-A"), Call::held("session-Y-A"));
    let task_x = start_held(&server, &x, "1", &xa).await?;
    let task_y = start_held(&server, &y, "1", &ya).await?;
    assert_eq!(layer.stats().in_flight_sessions, 2);

    let (_, answer) = x.cancel("1").await;
    assert_eq!(answer.status, Some(202));
    assert_eq!(layer.stats().cancelled_total, 1);
    server
        .log
        .wait_for_all(
            &["cancelled:session-X-A", "finished:session-X-A"],
            WAIT_TIMEOUT,
        )
        .await?;
    let y_duplicate = y
        .call("1", &Call::new("session-Y-dup", 0), OK_TIMEOUT)
        .await;
    assert_refused(&y_duplicate, 400, -32600);
    settle(&x, "session-X-ping").await;
    assert_own(&x.call("1", &Call::new("session-X-C", 0), OK_TIMEOUT).await);

    server.gates.release(&ya.sentinel);
    assert_own(&finish(task_y).await);
    assert_eq!(server.log.of(&ya.sentinel), ["started", "finished"]);
    assert_ended_without_response(&finish(task_x).await);
    let stats = assert_released(&layer).await;
    assert_eq!((stats.cancelled_total, stats.rejected_total), (1, 1));
    server.stop().await;
    Ok(())
}

/// A handler that does not stop when cancelled (the spec lets a receiver
/// ignore a cancellation it cannot honour) still returns its result later,
/// and rmcp routes it by id. The guard frees `1` for the client at the
/// cancellation but keeps it shadowed, so the next `id: 1` call C reaches
/// rmcp with a server-side id: when A finishes, its late result cannot take
/// C's place, and C gets its own result (before shadowing, C got A's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_result_of_a_cancelled_call_stays_away_from_a_reused_id() -> anyhow::Result<()> {
    late_result_scenario(IdGuardLayer::new(), "late-remap").await
}

/// The same scenario with `.rewrite_all_ids(true)`: A and C reach rmcp with
/// different server-side ids, so A's late result is dropped by rmcp (its id
/// was cancelled) and C gets its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_result_of_a_cancelled_call_is_dropped_with_rewrite_all_ids() -> anyhow::Result<()> {
    late_result_scenario(IdGuardLayer::new().rewrite_all_ids(true), "late-all").await
}

async fn late_result_scenario(layer: IdGuardLayer, tag: &str) -> anyhow::Result<()> {
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let a = Call::stubborn(format!("{tag}-A"));
    let c = Call::held(format!("{tag}-C"));
    let task_a = start_held(&server, &session, "1", &a).await?;
    let (_, answer) = session.cancel("1").await;
    assert_eq!(answer.status, Some(202));
    server
        .log
        .wait_for(&format!("cancelled:{}", a.sentinel), WAIT_TIMEOUT)
        .await?;
    // C is expected to be answered right after its release: a call still
    // unanswered after the hang bound counts as hung.
    let task_c = spawn_call(&session, "1", &c, HANG_TIMEOUT);
    server
        .log
        .wait_for(&format!("started:{}", c.sentinel), WAIT_TIMEOUT)
        .await?;

    server.gates.release(&a.sentinel);
    server
        .log
        .wait_for(&format!("finished:{}", a.sentinel), WAIT_TIMEOUT)
        .await?;
    // rmcp has handled A's late result before C's (one FIFO channel carries
    // both), whatever it did with it.
    settle(&session, &format!("{tag}-ping")).await;
    server.gates.release(&c.sentinel);
    let report_c = finish(task_c).await;
    eprintln!(
        "{tag}: C {:?}, C's log {:?}",
        report_c.outcome,
        server.log.of(&c.sentinel)
    );
    assert_own(&report_c);
    assert_eq!(server.log.of(&c.sentinel), ["started", "finished"]);
    assert_ended_without_response(&finish(task_a).await);
    server.stop().await;
    Ok(())
}

/// The guard matches `requestId` by its collision key, so `"1"` names the
/// in-flight request sent as `1`. It forwards the cancellation with
/// `requestId` spelled as the server knows the request (`1`), so rmcp, which
/// keys ids by type, cancels exactly the request the guard freed: guard and
/// server stay in step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_equivalent_id_keeps_guard_and_server_in_step() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let a = Call::held("typed-A");
    let task_a = start_held(&server, &session, "1", &a).await?;
    let (_, answer) = session.cancel(r#""1""#).await;
    assert_eq!(answer.status, Some(202));
    server
        .log
        .wait_for_all(&["notified:1", "cancelled:typed-A"], WAIT_TIMEOUT)
        .await?;
    assert!(!server.log.contains(r#"notified:"1""#));
    assert_eq!(layer.stats().cancelled_total, 1);
    server.gates.release(&a.sentinel);
    drop(task_a);
    server.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// 2. Resumed and replayed GET streams
// ---------------------------------------------------------------------------

/// Resume through rmcp's own request-wise stream cache (no event store): A
/// (`"abc"`, held) is in flight, so B (`"abc"`, held) is remapped. The client
/// reads B's POST stream up to rmcp's priming event (an `id:`, `retry:` and
/// empty `data`), drops it, and resumes with `GET` + `Last-Event-ID: <that id>`
/// + `Mcp-Session-Id`. rmcp re-attaches B's stream to the GET; once B is
/// released its response arrives there, and the guard restores `"abc"` byte
/// for byte (no `mcp-id-guard:` text reaches the client) and counts it in
/// `restored_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_get_stream_restores_the_remapped_id() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let (a, b) = (Call::held("resume-A"), Call::held("resume-B"));
    let task_a = start_held(&server, &session, r#""abc""#, &a).await?;

    let (post, priming) = session
        .post_then_drop_after_first_event(r#""abc""#, &b)
        .await?;
    assert_eq!(post.status, Some(200), "{post:?}");
    assert_eq!(priming.data, "", "priming event has empty data: {post:?}");
    assert!(priming.retry.is_some(), "{post:?}");
    let priming_id = priming.id.clone().expect("the priming event has an id");
    server
        .log
        .wait_for("started:resume-B", WAIT_TIMEOUT)
        .await?;
    assert_eq!(layer.stats().remapped_total, 1);

    let resumed = session.resume(&priming_id, OK_TIMEOUT).await?;
    // rmcp ended B's POST stream when the GET took it over.
    let stats = stats_when(&layer, WAIT_TIMEOUT, |s| s.in_flight_requests == 1).await;
    assert_eq!(stats.in_flight_requests, 1, "{stats:?}");
    assert_eq!(stats.restored_total, 0);
    server.gates.release(&b.sentinel);
    let get = resumed.read_to_end().await;
    eprintln!("resumed GET stream: {:?}", get.body);

    assert_eq!(get.status, Some(200), "{get:?}");
    assert!(
        get.ended,
        "the resumed stream ends after the response: {get:?}"
    );
    let response = get.response.clone().expect("a response on the GET stream");
    assert_eq!(raw_id(&response).as_deref(), Some(r#""abc""#), "{response}");
    assert_eq!(
        classify_response(r#""abc""#, &b.sentinel, &response),
        Outcome::Own
    );
    assert!(!get.body.contains("mcp-id-guard:"), "{}", get.body);
    assert_eq!(layer.stats().restored_total, 1);

    server.gates.release(&a.sentinel);
    assert_own(&finish(task_a).await);
    let stats = assert_released(&layer).await;
    assert_eq!((stats.remapped_total, stats.restored_total), (1, 1));
    server.stop().await;
    Ok(())
}

/// Replay of a completed stream from rmcp's event store (`LocalSessionManager`
/// with an in-memory `EventStore`): B (`"abc"`, remapped while A holds
/// `"abc"`) loses its POST stream after the priming event, then completes. The
/// store shows what rmcp emitted: a response whose id is the guard's
/// server-side id wrapping `"abc"`. `GET` + `Last-Event-ID` replays it, and
/// the client receives `"abc"` byte for byte, with the event id unchanged;
/// `restored_total` goes up by one. Control: the same replay through a second,
/// bare endpoint over the same rmcp service delivers the server-side id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_response_on_get_restores_the_remapped_id() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve_with(Setup {
        guards: vec![Some(layer.clone()), None],
        event_store: true,
        ..Setup::default()
    })
    .await?;
    let events = server.events.clone().expect("an event store");
    let session = Session::open(server.url()).await?;
    let (a, b) = (Call::held("replay-A"), Call::held("replay-B"));
    let task_a = start_held(&server, &session, r#""abc""#, &a).await?;

    let (post, priming) = session
        .post_then_drop_after_first_event(r#""abc""#, &b)
        .await?;
    assert_eq!((post.status, priming.data.as_str()), (Some(200), ""));
    let priming_id = priming.id.clone().expect("the priming event has an id");
    server
        .log
        .wait_for("started:replay-B", WAIT_TIMEOUT)
        .await?;
    server.gates.release(&b.sentinel);
    events
        .wait_for_response_after(&priming_id, WAIT_TIMEOUT)
        .await?;
    let stored = events.stored_after(&priming_id);
    let (stored_event_id, emitted) = &stored[0];
    let emitted_id = raw_id(emitted).expect("an id");
    let emitted_text: String = serde_json::from_str(&emitted_id)?;
    assert!(
        emitted_text.starts_with("mcp-id-guard:") && emitted_text.ends_with(r#":"abc""#),
        "rmcp emitted the server-side id: {emitted_id}"
    );
    // The dropped POST stream's side of the exchange ends (its restored
    // count, if the server still wrote the response there, is settled).
    let stats = stats_when(&layer, WAIT_TIMEOUT, |s| s.in_flight_requests == 1).await;
    assert_eq!(stats.in_flight_requests, 1, "{stats:?}");

    // Control: the same replay through the bare endpoint carries the
    // server-side id (replays from the store are repeatable).
    let bare = session
        .via(&server.urls[1])
        .resume(&priming_id, OK_TIMEOUT)
        .await?
        .read_to_end()
        .await;
    assert_eq!(
        bare.response.as_deref().and_then(raw_id),
        Some(emitted_id.clone()),
        "{bare:?}"
    );
    assert_eq!(layer.stats().restored_total, stats.restored_total);

    let get = session
        .resume(&priming_id, OK_TIMEOUT)
        .await?
        .read_to_end()
        .await;
    eprintln!("replayed GET stream: {:?}", get.body);
    assert_eq!(get.status, Some(200), "{get:?}");
    assert!(get.ended, "a replay is finite: {get:?}");
    let replayed = get.events();
    let event = replayed
        .iter()
        .find(|event| event.data.contains("result"))
        .expect("the replayed response");
    assert_eq!(
        raw_id(&event.data).as_deref(),
        Some(r#""abc""#),
        "{event:?}"
    );
    assert_eq!(
        classify_response(r#""abc""#, &b.sentinel, &event.data),
        Outcome::Own
    );
    assert_eq!(
        event.id.as_ref(),
        Some(stored_event_id),
        "event id unchanged"
    );
    assert!(!get.body.contains("mcp-id-guard:"), "{}", get.body);
    assert_eq!(layer.stats().restored_total, stats.restored_total + 1);

    server.gates.release(&a.sentinel);
    assert_own(&finish(task_a).await);
    assert_released(&layer).await;
    server.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. Queue
// ---------------------------------------------------------------------------

/// From the server's log: the order in which calls started, or why two calls
/// were running at once (a `started` without a `finished` in between).
fn one_at_a_time(log: &[String]) -> Result<Vec<String>, String> {
    let mut running: Option<&str> = None;
    let mut order = Vec::new();
    for entry in log {
        if let Some(sentinel) = entry.strip_prefix("started:") {
            if let Some(other) = running {
                return Err(format!("{sentinel} started while {other} was running"));
            }
            running = Some(sentinel);
            order.push(sentinel.to_owned());
        } else if let Some(sentinel) = entry.strip_prefix("finished:") {
            if running != Some(sentinel) {
                return Err(format!("{sentinel} finished while {running:?} was running"));
            }
            running = None;
        }
    }
    Ok(order)
}

/// Queue: a burst of 12 concurrent `id: 1` calls (various work times) all get
/// their own result with id `1`, and the server's log shows them run one
/// after another: never two `started` without a `finished` in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_burst_runs_same_id_calls_one_after_another() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Queue);
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let calls: Vec<Call> = (0..BURST)
        .map(|i| Call::new(format!("qburst-{i:02}"), ((i * 7) % BURST) as u64 * 10))
        .collect();
    let reports =
        futures::future::join_all(calls.iter().map(|call| session.call("1", call, OK_TIMEOUT)))
            .await;
    reports.iter().for_each(assert_own);
    let log = server.log.snapshot();
    let order = one_at_a_time(&log).map_err(|overlap| anyhow::anyhow!("{overlap}: {log:?}"))?;
    assert_eq!(order.len(), BURST, "{log:?}");
    let stats = assert_released(&layer).await;
    assert_eq!(stats.passed_total + stats.queued_total, BURST as u64);
    assert!(stats.queued_total >= 1, "calls overlapped: {stats:?}");
    assert_eq!((stats.remapped_total, stats.rejected_total), (0, 0));
    server.stop().await;
    Ok(())
}

/// Queue, deterministic: call 0 (`id: 1`) is held, then calls 1..11 (`id: 1`,
/// held) are sent one by one, each once the previous is registered, so all 11
/// wait in the guard. Releasing them one at a time, each starts only after the
/// previous one's exchange ended, in the order sent (first come, first
/// served), and all get their own results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_hands_the_id_over_first_come_first_served() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Queue);
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let calls: Vec<Call> = (0..BURST)
        .map(|i| Call::held(format!("fifo-{i:02}")))
        .collect();
    let mut tasks = vec![start_held(&server, &session, "1", &calls[0]).await?];
    for (i, call) in calls.iter().enumerate().skip(1) {
        tasks.push(spawn_call(&session, "1", call, OK_TIMEOUT));
        let stats = stats_when(&layer, WAIT_TIMEOUT, |s| s.in_flight_requests == i + 1).await;
        assert_eq!(stats.in_flight_requests, i + 1, "{stats:?}");
    }
    assert_eq!(layer.stats().queued_total, (BURST - 1) as u64);
    for (i, (call, task)) in calls.iter().zip(tasks).enumerate() {
        server
            .log
            .wait_for(&format!("started:{}", call.sentinel), WAIT_TIMEOUT)
            .await?;
        let started = server
            .log
            .snapshot()
            .iter()
            .filter(|e| e.starts_with("started:"))
            .count();
        assert_eq!(started, i + 1, "only the granted call runs");
        server.gates.release(&call.sentinel);
        assert_own(&finish(task).await);
    }
    let log = server.log.snapshot();
    let order = one_at_a_time(&log).map_err(|overlap| anyhow::anyhow!("{overlap}: {log:?}"))?;
    let sent: Vec<&str> = calls.iter().map(|call| call.sentinel.as_str()).collect();
    assert_eq!(order, sent, "first come, first served");
    let stats = assert_released(&layer).await;
    assert_eq!(
        (stats.passed_total, stats.queued_total),
        (1, BURST as u64 - 1)
    );
    server.stop().await;
    Ok(())
}

/// Control for the order check above: under Remap two held `id: 1` calls run
/// at the same time, and `one_at_a_time` reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remap_runs_same_id_calls_at_once_control() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new();
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let (a, b) = (Call::held("overlap-A"), Call::held("overlap-B"));
    let task_a = start_held(&server, &session, "1", &a).await?;
    let task_b = start_held(&server, &session, "1", &b).await?;
    assert!(one_at_a_time(&server.log.snapshot()).is_err());
    server.gates.release(&a.sentinel);
    server.gates.release(&b.sentinel);
    assert_own(&finish(task_a).await);
    assert_own(&finish(task_b).await);
    server.stop().await;
    Ok(())
}

/// Queue with `.max_queue_wait(300 ms)`: while A (`id: 1`) is held, B
/// (`id: 1`) waits 300 ms and then gets `503` with
/// `{"jsonrpc":"2.0","id":1,"error":{"code":-32000,..}}` without reaching the
/// server; B has left the queue (one request in flight while A runs, none
/// after), and A, released, gets its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_wait_expires_with_503() -> anyhow::Result<()> {
    let wait = Duration::from_millis(300);
    let layer = IdGuardLayer::new()
        .on_duplicate(OnDuplicate::Queue)
        .max_queue_wait(wait);
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let a = Call::held("expiry-A");
    let task_a = start_held(&server, &session, "1", &a).await?;

    let b = session
        .call("1", &Call::new("expiry-B", 0), OK_TIMEOUT)
        .await;
    assert_refused(&b, 503, -32000);
    assert_eq!(b.exchange.content_type.as_deref(), Some("application/json"));
    assert!(b.exchange.elapsed >= wait, "{:?}", b.exchange.elapsed);
    let during = layer.stats();
    assert_eq!(
        (during.in_flight_requests, during.queued_total),
        (1, 1),
        "{during:?}"
    );
    assert!(!server.log.contains("started:expiry-B"));

    server.gates.release(&a.sentinel);
    assert_own(&finish(task_a).await);
    assert_released(&layer).await;
    assert!(!server.log.contains("started:expiry-B"));
    server.stop().await;
    Ok(())
}

/// Queue: A (`id: 1`) is held, B (`id: 1`) is queued (the guard counts it),
/// then B's client gives up and drops the request, as a client-side timeout
/// does. B leaves the queue (one request in flight again) and never reaches
/// the server: after A is released and answered, a third call C (`id: 1`),
/// which would have queued behind B, runs and answers, and the server's log
/// never shows `started:B`. The counters drain to 0/0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_request_whose_client_leaves_never_reaches_the_server() -> anyhow::Result<()> {
    let layer = IdGuardLayer::new().on_duplicate(OnDuplicate::Queue);
    let server = serve(Some(layer.clone())).await?;
    let session = Session::open(server.url()).await?;
    let a = Call::held("leave-A");
    let task_a = start_held(&server, &session, "1", &a).await?;
    let task_b = spawn_call(&session, "1", &Call::new("leave-B", 0), OK_TIMEOUT);
    let queued = stats_when(&layer, WAIT_TIMEOUT, |s| s.in_flight_requests == 2).await;
    assert_eq!(
        (queued.in_flight_requests, queued.queued_total),
        (2, 1),
        "{queued:?}"
    );

    task_b.abort();
    let left = stats_when(&layer, WAIT_TIMEOUT, |s| s.in_flight_requests == 1).await;
    assert_eq!(left.in_flight_requests, 1, "B left the queue: {left:?}");

    server.gates.release(&a.sentinel);
    assert_own(&finish(task_a).await);
    server
        .log
        .wait_for("finished:leave-A", WAIT_TIMEOUT)
        .await?;
    assert_own(
        &session
            .call("1", &Call::new("leave-C", 0), OK_TIMEOUT)
            .await,
    );
    assert!(
        !server.log.contains("started:leave-B"),
        "{:?}",
        server.log.snapshot()
    );
    assert_released(&layer).await;
    server.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. Replicas
// ---------------------------------------------------------------------------

/// One session, 12 concurrent held `id: 1` calls alternating between two
/// endpoints, each behind its own guard instance, over one shared rmcp
/// `StreamableHttpService` (clones share the session manager, so the session
/// works through both). All 12 are in the tool at once before any is
/// released.
async fn replica_burst(rewrite_all_ids: bool, tag: &str, within: Duration) -> anyhow::Result<()> {
    let layers = [
        IdGuardLayer::new().rewrite_all_ids(rewrite_all_ids),
        IdGuardLayer::new().rewrite_all_ids(rewrite_all_ids),
    ];
    let server = serve_with(Setup {
        guards: layers.iter().cloned().map(Some).collect(),
        event_store: false,
        ..Setup::default()
    })
    .await?;
    let first = Session::open(&server.urls[0]).await?;
    let endpoints = [first.clone(), first.via(&server.urls[1])];
    let calls: Vec<Call> = (0..BURST)
        .map(|i| Call::held(format!("{tag}-{i:02}")))
        .collect();
    let tasks: Vec<_> = calls
        .iter()
        .enumerate()
        .map(|(i, call)| spawn_call(&endpoints[i % 2], "1", call, within))
        .collect();
    let started: Vec<String> = calls
        .iter()
        .map(|call| format!("started:{}", call.sentinel))
        .collect();
    let started: Vec<&str> = started.iter().map(String::as_str).collect();
    server.log.wait_for_all(&started, WAIT_TIMEOUT).await?;
    for call in &calls {
        server.gates.release(&call.sentinel);
    }
    let mut reports = Vec::new();
    for task in tasks {
        reports.push(finish(task).await);
    }
    let outcomes: Vec<&Outcome> = reports.iter().map(|report| &report.outcome).collect();
    eprintln!("replicas, rewrite_all_ids({rewrite_all_ids}): {outcomes:?}");
    if rewrite_all_ids {
        reports.iter().for_each(assert_own);
        for layer in &layers {
            let stats = assert_released(layer).await;
            assert_eq!(
                (
                    stats.passed_total,
                    stats.remapped_total,
                    stats.restored_total
                ),
                (0, 6, 6),
                "{stats:?}"
            );
        }
    } else {
        let failed = reports
            .iter()
            .filter(|report| matches!(report.outcome, Outcome::Wrong { .. } | Outcome::Hung))
            .count();
        assert!(
            failed >= 1,
            "two guards that each pass one `1` through should collide: {outcomes:?}"
        );
    }
    server.stop().await;
    Ok(())
}

/// Replicas with `.rewrite_all_ids(true)`: every call gets its own result with
/// id `1`; each guard rewrote its 6 calls and restored 6 ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_rewrite_all_ids_never_collide() -> anyhow::Result<()> {
    replica_burst(true, "replicas-all", OK_TIMEOUT).await
}

/// Control: the same with `.rewrite_all_ids(false)` on both guards. Each guard
/// forwards its first `id: 1` unchanged, so rmcp has two requests `1` in
/// flight at once: at least one call gets another's result or hangs (bounded
/// by the hang timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_without_rewrite_all_ids_collide_control() -> anyhow::Result<()> {
    replica_burst(false, "replicas-dups", HANG_TIMEOUT).await
}
