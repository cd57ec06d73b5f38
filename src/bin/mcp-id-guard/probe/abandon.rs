//! `reuse-after-abandon`: a client gives up on a tool call (closes its
//! connection, or cancels it and then closes it) and reuses its id for a
//! `ping` while the server still runs the call. The call's late answer must
//! not reach the ping. Needs a tool that takes a while, so it runs only with
//! `--tool NAME --args JSON`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::client::{Client, Reply};
use super::judge::{judge, Received, Scorecard, Shape};
use super::report::{Check, Verdict};
use super::{open_session, Shapes};

pub(super) const NAME: &str = "reuse-after-abandon";
/// Most pings one trial sends.
const MAX_PINGS: usize = 200;
/// Shortest tool call worth abandoning: shorter ones end before the probe
/// can walk away from them.
const MIN_TOOL_TIME: Duration = Duration::from_millis(100);
/// The id of the call that measures the tool; the trials use the next ones.
const ID_BASE: u64 = 3000;

/// Runs both trials with the operator's tool, each in a session of its own.
pub(super) async fn check(base: &Client, shapes: &Shapes, tool: Option<(&str, &Value)>) -> Check {
    let Some((tool, arguments)) = tool else {
        return Check::plain(
            NAME,
            Verdict::Skipped,
            "skipped (needs --tool NAME --args JSON for a request that takes a while)",
        );
    };
    let call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": tool, "arguments": arguments}})
    };
    let took = match measure(base, &call(ID_BASE)).await {
        Ok(took) if took < MIN_TOOL_TIME => {
            let message = format!(
                "skipped: {tool} answered in {took:.0?}; pick arguments that make it take \
                 at least {MIN_TOOL_TIME:?}"
            );
            return Check::plain(NAME, Verdict::Skipped, message);
        }
        Ok(took) => took,
        Err(error) => return Check::plain(NAME, Verdict::Error, error),
    };
    // The trials pace themselves by the tool's time: two calls walked away
    // from, and pings until twice its time (and half a second) after each.
    base.run.extend(took * 6 + Duration::from_secs(1));
    let mut scorecard = Scorecard::default();
    let (mut pings, mut early) = (0, 0);
    for (offset, cancel) in [(1, false), (2, true)] {
        let id = ID_BASE + offset;
        let session = match open_session(base).await {
            Ok(session) => session.client,
            Err(error) => return Check::plain(NAME, Verdict::Error, error),
        };
        let outcome = trial(&session, &call(id), json!(id), cancel, took, shapes).await;
        session.end_session().await;
        let seen = match outcome {
            Ok(Some(seen)) => seen,
            Ok(None) => {
                early += 1;
                continue;
            }
            Err(error) => return Check::plain(NAME, Verdict::Error, error),
        };
        let how = if cancel { "cancelled" } else { "dropped" };
        for (index, seen) in seen.iter().enumerate() {
            scorecard.add(seen, || {
                format!("ping {} with the id of a {how} call", index + 1)
            });
        }
        pings += seen.len();
        scorecard.trial(&seen);
    }
    if early == 2 {
        let message = format!(
            "skipped: {tool} answered before the probe could walk away from it (it took \
             {took:.0?} once); pick arguments that make it take longer"
        );
        return Check::plain(NAME, Verdict::Skipped, message);
    }
    let early = match early {
        0 => String::new(),
        _ => " (one call ended too soon to abandon)".to_owned(),
    };
    scorecard.check(
        NAME,
        &format!(
            "{tool} (took {took:.0?}) abandoned twice (connection dropped; \
             notifications/cancelled){early}, {pings} pings reusing its id"
        ),
    )
}

/// One call of the tool, in a session of its own: how long it takes.
async fn measure(base: &Client, call: &Value) -> Result<Duration, String> {
    let session = open_session(base).await?.client;
    let started = Instant::now();
    let reply = session.call(call, &[]).await;
    let took = started.elapsed();
    session.end_session().await;
    match reply {
        Reply::Answer { answer, .. } if !matches!(answer.shape, Shape::Error(_)) => Ok(took),
        Reply::Answer { answer, .. } => Err(format!(
            "the tool call failed: {}",
            answer.error_message.as_deref().unwrap_or("an error")
        )),
        Reply::OutOfTime => Err("the probe ran out of time".to_owned()),
        Reply::Hung => Err(format!(
            "the tool call took longer than --timeout ({:?}): raise it or pick a quicker call",
            base.timeout
        )),
        other => Err(format!("the tool call got no answer: {other:?}")),
    }
}

/// Starts `call`, walks away from it a third of the way through its usual
/// time (after `notifications/cancelled` if `cancel`), then sends pings with
/// its id: one at once, then back to back around the time its answer would
/// come, until a while after. `None` when the call ended before the probe
/// could walk away from it.
async fn trial(
    client: &Client,
    call: &Value,
    id: Value,
    cancel: bool,
    took: Duration,
    shapes: &Shapes,
) -> Result<Option<Vec<Received>>, String> {
    let mut connection = client.connect().await?;
    let request = client.post(call, &[]);
    let started = Instant::now();
    let running = tokio::spawn({
        let client = client.clone();
        async move { client.send(&mut connection, request).await.0 }
    });
    // Pacing, not synchronisation: the server has no way to say it started
    // the call, so the probe gives it a third of the call's usual time.
    client.pause(took / 3).await;
    if running.is_finished() {
        return Ok(None);
    }
    if cancel {
        let notification = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                  "params": {"requestId": id, "reason": "mcp-id-guard probe"}});
        if let Reply::Hung = client.call(&notification, &[]).await {
            return Err("notifications/cancelled got no answer".to_owned());
        }
    }
    // Aborting the task drops the connection: the request is abandoned.
    running.abort();
    let _ = running.await;

    let ping = json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
    let swarm_from = started + took * 4 / 5;
    let until = started + (took * 2 + Duration::from_millis(500)).min(client.timeout * 2);
    let mut seen = Vec::new();
    let mut connection = client.connect().await?;
    loop {
        if !connection.is_ready(client.timeout).await {
            connection = client.connect().await?;
        }
        let (reply, _) = client.send(&mut connection, client.post(&ping, &[])).await;
        let judged = judge(&reply, &id, &shapes.ping);
        let failed = !matches!(judged, Received::Own | Received::Refused { .. });
        seen.push(judged);
        if failed || seen.len() >= MAX_PINGS || Instant::now() >= until {
            return Ok(Some(seen));
        }
        if seen.len() == 1 && Instant::now() < swarm_from {
            // Pacing: the pings cluster where the call's answer will come.
            client
                .pause(swarm_from.saturating_duration_since(Instant::now()))
                .await;
        }
    }
}
