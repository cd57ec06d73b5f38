//! Hostile ids (#42): in some seeds each client also runs a conversation
//! whose calls, in the same session as its `id: 1` calls, carry ids a
//! hostile client would send:
//!
//! - a server-side id the server leaked (it runs another request of the
//!   session under it now: see [`Oracle::leak`]), or one forged in the
//!   guard's own shape with a MAC nobody issued;
//! - spellings of `1` that a server reads as `1`: `"\u0031"`, `1.0`, `1e0`
//!   (the server keys ids as python-sdk and JavaScript both do);
//! - `-0` and `null` (no request: JSON-RPC reserves it);
//! - ids servers read differently, which the guard refuses (`400`,
//!   `-32600`, `id: null`): an integer past 2^53, an object, `true`.
//!
//! The oracle: each call gets its own answer carrying its id as sent (the
//! guard restores exactly what it issued, one level, for that request), the
//! server never runs two requests under one id (a leaked id reused must be
//! remapped, not passed as it is), and a refused call never reaches the
//! server.

use std::rc::Rc;
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::client::{call_as, post_raw, timed_out_inside, Plan, Sessions, Target};
use crate::oracle::{Oracle, Outcome};
use crate::read::within_read_timeout;
use crate::upstream::UNKNOWN_SESSION;
use crate::world::{Quirks, Setup};

/// How many hostile calls a client makes.
const CALLS: usize = 4;

/// Ids as a hostile client writes them, and whether the guard refuses them.
const SPELLINGS: [(&str, bool); 10] = [
    ("leaked", false),
    (r#""mcp-id-guard:0123456789abcdef:7:1""#, false),
    (r#""\u0031""#, false),
    ("1.0", false),
    ("1e0", false),
    ("-0", false),
    ("null", false),
    ("9007199254740993", true),
    (r#"{"id":1}"#, true),
    ("true", true),
];

/// A client's hostile conversation (see the module).
pub async fn conversation(
    name: &str,
    sessions: &Rc<tokio::sync::Mutex<Sessions>>,
    setup: &Setup,
    quirks: &Quirks,
    seed: u64,
    oracle: &Oracle,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    for index in 0..CALLS {
        let think = rng.random_range(0..setup.max_think_ms * 2);
        tokio::time::sleep(Duration::from_millis(think)).await;
        let session = sessions.lock().await.current.clone();
        let marker = format!("{name}/hostile-{index}");
        let ms = rng.random_range(0..=setup.max_tool_ms);
        // A leaked id often: the others are simpler to get right.
        let (spelling, refused) = if rng.random_bool(0.4) {
            SPELLINGS[0]
        } else {
            SPELLINGS[rng.random_range(1..SPELLINGS.len())]
        };
        // A leaked id, else one forged in its shape.
        let text = match spelling {
            "leaked" => oracle
                .leaked(&session)
                .map_or_else(|| SPELLINGS[1].0.to_owned(), |id| id.to_string()),
            other => other.to_owned(),
        };
        let id: Value = serde_json::from_str(&text).expect("ids are JSON");
        // A leaked id's counter starts at a random point: not in the story.
        let leaked = spelling == "leaked" && text != SPELLINGS[1].0;
        let told = if leaked { "a leaked one" } else { &text };
        oracle.note(&format!("{marker}: id {told}"));
        let body = json!({
            "jsonrpc": "2.0", "id": "ID", "method": "tools/call",
            "params": {"name": "slow", "arguments": {"marker": marker, "ms": ms}}
        })
        .to_string()
        .replacen(r#""ID""#, &text, 1);
        if refused || id.is_null() {
            not_run(setup, quirks, &session, body, &marker, refused, oracle).await;
            continue;
        }
        let target = Target {
            session: &session,
            id: &id,
            body,
        };
        let _ = call_as(setup, quirks, target, &marker, ms, Plan::Wait, oracle).await;
    }
}

/// A call that must not run: refused by the guard on its id (`400`,
/// `-32600`, `id: null`), or with `id: null` taken as a notification
/// (`202`); the server never starts it.
async fn not_run(
    setup: &Setup,
    quirks: &Quirks,
    session: &str,
    body: String,
    marker: &str,
    refused: bool,
    oracle: &Oracle,
) {
    let exchange = async {
        let response = post_raw(Some(session), body, &[]).await?;
        let status = response.status();
        let unknown = response.headers().contains_key(UNKNOWN_SESSION);
        let bytes = within_read_timeout(response.into_body().collect())
            .await??
            .to_bytes();
        Ok::<_, Box<dyn std::error::Error>>((status, unknown, bytes))
    };
    match tokio::time::timeout(setup.client_bound, exchange).await {
        Ok(Ok((status, unknown, bytes))) => {
            let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let expected = if refused {
                status == StatusCode::BAD_REQUEST
                    && answer["error"]["code"] == json!(-32600)
                    && answer["id"].is_null()
            } else {
                status == StatusCode::ACCEPTED
            };
            if status.is_server_error() && setup.faults {
                // The proxy's stand-in for an unreachable upstream.
                oracle.ended(marker, Outcome::Broken);
            } else if timed_out_inside(quirks, status) && !refused {
                // The timeout inside the guard, slower than a held link.
                oracle.ended(marker, Outcome::TimedOut);
            } else if status == StatusCode::NOT_FOUND && unknown && !refused {
                // A restarted server forgot the session (the guard let the
                // notification pass).
                oracle.ended(marker, Outcome::SessionLost);
            } else if !expected {
                oracle.violation(format!("{marker}: not refused: {status} {answer}"));
            } else if oracle.was_started(marker) {
                oracle.violation(format!("{marker}: refused, yet the server ran it"));
            } else {
                oracle.ended(marker, Outcome::Error(status.as_u16()));
            }
        }
        Ok(Err(_)) if setup.faults => oracle.ended(marker, Outcome::Broken),
        Ok(Err(error)) => oracle.violation(format!("{marker}: failed: {error}")),
        Err(_) => oracle.violation(format!("{marker}: its refusal did not come")),
    }
}
