//! Batches (#42): in some seeds each client also sends JSON-RPC batches
//! (2025-03-26) into its session: `tools/call`s under `id: 1` (a duplicate
//! of the conversations' calls in flight), under an id of the batch's own,
//! sometimes `id: 1` twice in one batch, and a notification, in a
//! seed-chosen order. The guard's promises for them:
//!
//! - under `Remap`, every request of the batch is tracked and reaches the
//!   server under an id no other request of the session has: each gets its
//!   own answer, its own id restored, in the one array (the server never
//!   runs two requests under one id);
//! - under `Reject` or `Queue`, a batch with a duplicate (`id: 1` twice in
//!   it always is) is refused whole: an array of one `-32600` error per
//!   request, each carrying its id, and none of them reaches the server;
//!   one without is answered as under `Remap`.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use mcp_id_guard::OnDuplicate;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::client::{post, timed_out_inside, Sessions};
use crate::oracle::{Oracle, Outcome};
use crate::read::within_read_timeout;
use crate::respond::BOM;
use crate::upstream::UNKNOWN_SESSION;
use crate::world::{Quirks, Setup};

/// How many batches a client sends.
const BATCHES: usize = 3;

/// A client's batch conversation: [`BATCHES`] batches one after another in
/// its current session, each judged.
pub async fn conversation(
    name: &str,
    sessions: &Rc<tokio::sync::Mutex<Sessions>>,
    setup: &Setup,
    quirks: &Quirks,
    seed: u64,
    oracle: &Oracle,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let policy = setup.policy.expect("the world names the policy");
    for index in 0..BATCHES {
        let think = rng.random_range(0..setup.max_think_ms * 2);
        tokio::time::sleep(Duration::from_millis(think)).await;
        let session = sessions.lock().await.current.clone();
        // (id, marker) of each request; the notification has none.
        let mut requests = vec![
            (json!(1), format!("{name}/batch-{index}/a")),
            (
                json!(format!("{name}-batch-{index}")),
                format!("{name}/batch-{index}/b"),
            ),
        ];
        let twice = rng.random_bool(0.5);
        if twice {
            requests.push((json!(1), format!("{name}/batch-{index}/c")));
        }
        let mut members: Vec<Value> = requests
            .iter()
            .map(|(id, marker)| {
                let ms = rng.random_range(0..=setup.max_tool_ms / 2);
                json!({
                    "jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "slow", "arguments": {"marker": marker, "ms": ms}}
                })
            })
            .collect();
        members.push(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}));
        members.shuffle(&mut rng);
        let message = Value::Array(members);
        let exchange = async {
            let response = post(Some(&session), &message).await?;
            let status = response.status();
            let unknown = response.headers().contains_key(UNKNOWN_SESSION);
            let bytes = within_read_timeout(response.into_body().collect())
                .await??
                .to_bytes();
            Ok::<_, Box<dyn std::error::Error>>((status, unknown, bytes))
        };
        let markers = || requests.iter().map(|(_, marker)| marker.as_str());
        match tokio::time::timeout(setup.client_bound, exchange).await {
            Ok(Ok((status, true, _))) if status == StatusCode::NOT_FOUND => {
                markers().for_each(|marker| oracle.ended(marker, Outcome::SessionLost));
            }
            Ok(Ok((status, _, _))) if timed_out_inside(quirks, status) => {
                markers().for_each(|marker| oracle.ended(marker, Outcome::TimedOut));
            }
            // The proxy's stand-in for an unreachable upstream.
            Ok(Ok((status, _, _))) if status.is_server_error() && setup.faults => {
                markers().for_each(|marker| oracle.ended(marker, Outcome::Broken));
            }
            Ok(Ok((status, _, bytes))) => {
                let body = bytes.strip_prefix(BOM).unwrap_or(&bytes);
                let answers = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
                judge(&requests, twice, policy, status, &answers, oracle);
            }
            Ok(Err(_)) if setup.faults => {
                markers().for_each(|marker| oracle.ended(marker, Outcome::Broken));
            }
            Ok(Err(error)) => oracle.violation(format!("{name}/batch-{index}: failed: {error}")),
            Err(_) => oracle.violation(format!(
                "{name}/batch-{index}: did not end within {:?}",
                setup.client_bound
            )),
        }
    }
}

/// Whether the batch's answer keeps the guard's promises (see the module).
fn judge(
    requests: &[(Value, String)],
    twice: bool,
    policy: OnDuplicate,
    status: StatusCode,
    answers: &Value,
    oracle: &Oracle,
) {
    let batch = requests[0]
        .1
        .rsplit_once('/')
        .map_or("", |(batch, _)| batch);
    let Some(answers) = answers.as_array() else {
        oracle.violation(format!("{batch}: {status}, not an array: {answers}"));
        return;
    };
    let refused = answers.len() == requests.len()
        && answers
            .iter()
            .all(|answer| answer["error"]["code"] == json!(-32600));
    if refused {
        if policy == OnDuplicate::Remap {
            oracle.violation(format!("{batch}: refused under Remap: {answers:?}"));
        }
        let mut sent: Vec<&Value> = requests.iter().map(|(id, _)| id).collect();
        for answer in answers {
            match sent.iter().position(|id| **id == answer["id"]) {
                Some(at) => {
                    sent.swap_remove(at);
                }
                None => oracle.violation(format!(
                    "{batch}: a refusal for an id it did not send: {answer}"
                )),
            }
        }
        for (_, marker) in requests {
            if oracle.was_started(marker) {
                oracle.violation(format!("{marker}: refused, yet the server ran it"));
            }
            oracle.ended(marker, Outcome::Error(status.as_u16()));
        }
        return;
    }
    if twice && policy != OnDuplicate::Remap {
        oracle.violation(format!(
            "{batch}: id 1 twice under {policy:?}, not refused: {status} {answers:?}"
        ));
    }
    // The markers each id's answers carried, and the markers sent under it.
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for answer in answers {
        let marker = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        got.entry(answer["id"].to_string())
            .or_default()
            .push(marker.to_owned());
    }
    for (id, marker) in requests {
        let under = got.entry(id.to_string()).or_default();
        match under.iter().position(|got| got == marker) {
            Some(at) => {
                under.swap_remove(at);
                oracle.ended(marker, Outcome::Answered);
            }
            None if oracle.was_cancelled(marker) => {
                oracle.ended(marker, Outcome::CancelledByAnother);
            }
            None => oracle.violation(format!("{marker}: no answer of its own in {answers:?}")),
        }
    }
    for (id, left) in got {
        for marker in left {
            oracle.violation(format!(
                "{batch}: cross-wired: an answer with id {id} carrying {marker:?}"
            ));
        }
    }
}
