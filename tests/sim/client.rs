//! Simulated Claude-style clients: one session per client, pooled across
//! many concurrent conversations, every `tools/call` with `id: 1`, each on
//! a connection of its own; each call carries a payload marker naming its
//! client, conversation and turn, which the server's tool echoes. They read
//! SSE and JSON as WHATWG clients do (a leading byte order mark skipped).

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::oracle::{Oracle, Outcome};
use crate::read::{read, within_read_timeout, Read};
use crate::upstream::UNKNOWN_SESSION;
use crate::world::{Quirks, Setup, GUARD_HOST, GUARD_PORT};

/// The client's session, shared by its conversations, and every session it
/// had (a restarted server forgets them: the client starts another).
pub struct Sessions {
    pub current: String,
    pub all: Vec<String>,
}

/// One client: its session, then its conversations, all at once. Returns
/// every session it used.
pub async fn run(
    name: String,
    setup: Setup,
    quirks: Quirks,
    seed: u64,
    oracle: Oracle,
) -> turmoil::Result<Vec<String>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let first = initialize(&name, &setup, &oracle).await?;
    let sessions = Rc::new(tokio::sync::Mutex::new(Sessions {
        current: first.clone(),
        all: vec![first],
    }));
    let mut conversations = tokio::task::JoinSet::new();
    for conversation in 0..setup.conversations {
        let mut rng = StdRng::seed_from_u64(rng.random());
        let (name, sessions, setup, oracle) = (
            name.clone(),
            Rc::clone(&sessions),
            setup.clone(),
            oracle.clone(),
        );
        conversations.spawn_local(async move {
            // Conversations start spread over a few seconds.
            let start = rng.random_range(0..setup.max_think_ms);
            tokio::time::sleep(Duration::from_millis(start)).await;
            for turn in 0..setup.turns {
                let marker = format!("{name}/conversation-{conversation}/turn-{turn}");
                let ms = rng.random_range(0..=setup.max_tool_ms);
                let after = Duration::from_millis(rng.random_range(0..=ms.max(1)));
                let plan = match rng.random::<f64>() {
                    x if x < setup.disconnect_rate => Plan::Disconnect(after),
                    x if x < setup.disconnect_rate + setup.cancel_rate => Plan::Cancel(after),
                    _ => Plan::Wait,
                };
                let replay = rng.random_bool(setup.replay_rate);
                let session = sessions.lock().await.current.clone();
                let called = call(&setup, &quirks, &session, &marker, ms, plan, &oracle).await;
                if called.session_lost {
                    // The server forgot the session: the first conversation
                    // to find out starts another, as clients do on 404.
                    let mut sessions = sessions.lock().await;
                    if sessions.current == session {
                        match initialize(&name, &setup, &oracle).await {
                            Ok(new) => {
                                sessions.current = new.clone();
                                sessions.all.push(new);
                            }
                            Err(error) => {
                                oracle.note(&format!("{name}: initialize failed: {error}"))
                            }
                        }
                    }
                } else if let Some(from) = called.replay_from.filter(|_| replay) {
                    replay_answer(&setup, &session, &marker, &from, &oracle).await;
                }
                let think = rng.random_range(0..setup.max_think_ms);
                tokio::time::sleep(Duration::from_millis(think)).await;
            }
        });
    }
    if quirks.batches {
        // The batch conversation, in the same session: its `id: 1` members
        // duplicate the conversations' calls in flight.
        let (name, sessions, setup, oracle) = (
            name.clone(),
            Rc::clone(&sessions),
            setup.clone(),
            oracle.clone(),
        );
        let seed = rng.random();
        conversations.spawn_local(async move {
            crate::batch::conversation(&name, &sessions, &setup, &quirks, seed, &oracle).await;
        });
    }
    if quirks.hostile {
        // The hostile conversation, in the same session.
        let (name, sessions, setup, oracle) = (
            name.clone(),
            Rc::clone(&sessions),
            setup.clone(),
            oracle.clone(),
        );
        let seed = rng.random();
        conversations.spawn_local(async move {
            crate::hostile::conversation(&name, &sessions, &setup, &quirks, seed, &oracle).await;
        });
    }
    while conversations.join_next().await.is_some() {}
    let all = std::mem::take(&mut sessions.lock().await.all);
    Ok(all)
}

/// A `ping` with no session: the guard looks at whether its restart window
/// has ended on the way (then it gives back the sessions it saw starting).
/// Untracked, so nothing of it stays in the table.
pub async fn touch_window() -> Result<StatusCode, Box<dyn std::error::Error>> {
    let message = json!({"jsonrpc": "2.0", "id": "last", "method": "ping"});
    let response = post(None, &message).await?;
    let status = response.status();
    let _ = response.into_body().collect().await?;
    Ok(status)
}

/// A message that touches `session`'s part of the guard's table (which
/// drops expired abandoned ids there as it goes).
pub async fn touch(session: &str) -> Result<StatusCode, Box<dyn std::error::Error>> {
    // A notification, not a request: a request answered `404` by a server
    // that lost the session would itself be abandoned (a status is no
    // answer), and the table would never be seen empty. A cancellation that
    // names no request passes unchanged, and the guard looks at the
    // session's ids on the way.
    let message = json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": "sim-final-check"}
    });
    let response = post(Some(session), &message).await?;
    let status = response.status();
    let _ = response.into_body().collect().await?;
    Ok(status)
}

/// `initialize` and `notifications/initialized`, through the guard: the
/// session id.
pub async fn initialize(name: &str, setup: &Setup, oracle: &Oracle) -> turmoil::Result<String> {
    // Under faults (a restart, a held or partitioned link) a client tries
    // again, as real ones do, a second apart for longer than a link stays
    // down; without them the first failure counts.
    let attempts = if setup.faults {
        10 + setup.max_hold.as_secs()
    } else {
        1
    };
    let mut last = String::new();
    for _ in 0..attempts {
        match tokio::time::timeout(setup.client_bound, start_session(name)).await {
            Ok(Ok(session)) => return Ok(session),
            Ok(Err(error)) => last = error.to_string(),
            Err(_) => last = format!("no answer within {:?}", setup.client_bound),
        }
        oracle.note(&format!("{name}: initialize failed: {last}"));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(format!("{name}: initialize failed {attempts} times, the last: {last}").into())
}

/// `initialize`, then `notifications/initialized` (which the server must
/// accept).
async fn start_session(name: &str) -> Result<String, Box<dyn std::error::Error>> {
    let message = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": name, "version": "0"}}
    });
    let response = post(None, &message).await?;
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| format!("initialize got {status} and no session"))?;
    let _ = response.into_body().collect().await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let status = post(Some(&session), &initialized).await?.status();
    if status != StatusCode::ACCEPTED {
        return Err(format!("notifications/initialized got {status}").into());
    }
    Ok(session)
}

/// What the client does with a call besides waiting for its answer.
#[derive(Clone, Copy, Debug)]
pub enum Plan {
    /// Waits, polling a stream closed early.
    Wait,
    /// Drops the connection after this long.
    Disconnect(Duration),
    /// After this long, sends `notifications/cancelled` for `id: 1` and
    /// stops waiting.
    Cancel(Duration),
}

/// How a call ended, for what its conversation does next.
pub struct Called {
    /// The server no longer knows the session.
    pub session_lost: bool,
    /// Its own answer reached the client (on its POST's stream, or on a
    /// resumption): `Some(polls)`, the number of resumptions it took.
    pub answered: Option<u32>,
    /// Answered on the POST's own stream after an event with this id: where
    /// a client resumes to have the answer replayed.
    replay_from: Option<String>,
}

/// Whether `status` is the empty `408` of the timeout inside the guard
/// (tower-http's), which answers in the server's place while the server
/// runs on: an ending the stack's owner chose, not the guard's failure.
pub fn timed_out_inside(quirks: &Quirks, status: StatusCode) -> bool {
    quirks.inner_timeout.is_some() && status == StatusCode::REQUEST_TIMEOUT
}

/// One `tools/call` with `id: 1` on a new connection, judged.
pub async fn call(
    setup: &Setup,
    quirks: &Quirks,
    session: &str,
    marker: &str,
    ms: u64,
    plan: Plan,
    oracle: &Oracle,
) -> Called {
    let message = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"marker": marker, "ms": ms}}
    });
    let target = Target {
        session,
        id: &json!(1),
        body: message.to_string(),
    };
    call_as(setup, quirks, target, marker, ms, plan, oracle).await
}

/// Where a call goes and what it is: its body as written (an id may be
/// spelled as a hostile client spells it) and its id as read.
pub struct Target<'a> {
    pub session: &'a str,
    pub id: &'a Value,
    pub body: String,
}

/// One `tools/call` on a new connection, judged: its answer must carry
/// `target.id` (as read) and its own marker.
pub async fn call_as(
    setup: &Setup,
    quirks: &Quirks,
    target: Target<'_>,
    marker: &str,
    ms: u64,
    plan: Plan,
    oracle: &Oracle,
) -> Called {
    let Target { session, id, body } = target;
    let mut called = Called {
        session_lost: false,
        answered: None,
        replay_from: None,
    };
    // Some calls of a hiding client claim revision 2026-07-28 and name that
    // header in `Connection` (chosen by the marker, so the seed's other
    // draws stay as they were).
    let hides = quirks.hiding && {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(marker, &mut hasher);
        std::hash::Hasher::finish(&hasher) % 4 == 0
    };
    let extra: &[(&str, &str)] = if hides {
        &[
            ("mcp-protocol-version", "2026-07-28"),
            ("connection", "keep-alive, MCP-Protocol-Version"),
        ]
    } else {
        &[]
    };
    let exchange = async {
        let (status, mut got) = read(post_raw(Some(session), body, extra)).await?;
        answer_server(session, &got.asked, quirks, oracle).await;
        oracle.note(&format!(
            "{marker}: POST: {status}, last event {:?}, answer {}",
            got.last_event,
            got.answer.is_some()
        ));
        let mut polls = 0;
        // A stream closed (or cut) before its answer, with an event id to
        // resume from: poll with `GET` + `Last-Event-ID` (SEP-1699).
        while got.answer.is_none() && polls < setup.max_polls {
            let Some(last) = got.last_event.clone() else {
                break;
            };
            polls += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (status, more) = read(resume(session, &last)).await?;
            answer_server(session, &more.asked, quirks, oracle).await;
            oracle.note(&format!(
                "{marker}: GET after {last}: {status}, last event {:?}, answer {}",
                more.last_event,
                more.answer.is_some()
            ));
            if status.is_server_error() || timed_out_inside(quirks, status) {
                // The upstream is unreachable for now (a fault), or slower
                // than the timeout inside the guard: poll again.
                got.cut = true;
                continue;
            }
            if status != StatusCode::OK {
                // The stream is gone (its request was cancelled, or the
                // server restarted).
                got.text = more.text;
                got.unknown_session = more.unknown_session;
                break;
            }
            got.last_event = more.last_event.or(Some(last));
            got.answer = more.answer;
            got.text = more.text;
            got.cut = more.cut;
        }
        Ok::<_, Box<dyn std::error::Error>>((status, got, polls))
    };
    let bound = match plan {
        Plan::Wait => setup.client_bound,
        Plan::Disconnect(after) | Plan::Cancel(after) => after,
    };
    match (tokio::time::timeout(bound, exchange).await, plan) {
        (Err(_), Plan::Disconnect(_)) => oracle.ended(marker, Outcome::Disconnected),
        (Ok(Ok((_, read, _))), _) if read.unknown_session => {
            oracle.ended(marker, Outcome::SessionLost);
            called.session_lost = true;
            return called;
        }
        (Err(_), Plan::Cancel(_)) => {
            let cancel = json!({
                "jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": 1, "reason": marker}
            });
            match tokio::time::timeout(setup.client_bound, post(Some(session), &cancel)).await {
                Ok(Ok(response)) if response.status() == StatusCode::ACCEPTED => {
                    oracle.ended(marker, Outcome::Cancelled);
                }
                Ok(Ok(response))
                    if response.status() == StatusCode::NOT_FOUND
                        && response.headers().contains_key(UNKNOWN_SESSION) =>
                {
                    oracle.ended(marker, Outcome::SessionLost);
                    called.session_lost = true;
                    return called;
                }
                // The guard or the proxy answered in the upstream's place
                // (unreachable, held), or the timeout inside the guard did:
                // the cancellation may not have reached it; the client has
                // stopped waiting all the same.
                Ok(Ok(response))
                    if (response.status().is_server_error() && setup.faults)
                        || timed_out_inside(quirks, response.status()) =>
                {
                    oracle.ended(marker, Outcome::Cancelled);
                }
                Ok(Ok(response)) => oracle.violation(format!(
                    "{marker}: its cancellation got {}",
                    response.status()
                )),
                Ok(Err(_)) if setup.faults => oracle.ended(marker, Outcome::Broken),
                Ok(Err(error)) => {
                    oracle.violation(format!("{marker}: its cancellation failed: {error}"));
                }
                Err(_) => oracle.violation(format!("{marker}: its cancellation did not end")),
            }
        }
        (Err(_), Plan::Wait) => oracle.violation(format!(
            "{marker}: did not end within {:?} (tool {ms} ms)",
            setup.client_bound
        )),
        // A connection broken by a fault (a held link, a restart).
        (Ok(Err(error)), _) if setup.faults => {
            oracle.note(&format!("{marker}: broken: {error}"));
            oracle.ended(marker, Outcome::Broken);
        }
        (Ok(Ok((_, read, _))), _) if read.answer.is_none() && read.cut && setup.faults => {
            oracle.ended(marker, Outcome::Broken);
        }
        (Ok(Err(error)), _) => oracle.violation(format!("{marker}: failed: {error}")),
        (Ok(Ok((status, read, _))), _)
            if read.answer.is_none() && timed_out_inside(quirks, status) =>
        {
            oracle.ended(marker, Outcome::TimedOut);
        }
        // The guard refuses a call that hides a header it reads (400, a
        // JSON-RPC error with `id: null`: it refuses on the headers).
        (Ok(Ok((status, read, _))), _)
            if hides
                && status == StatusCode::BAD_REQUEST
                && read.answer.as_ref().is_some_and(|answer| {
                    answer["id"].is_null() && answer["error"]["code"] == json!(-32600)
                }) =>
        {
            oracle.ended(marker, Outcome::Error(400));
        }
        (Ok(Ok((status, read, polls))), _) => {
            if judge(marker, id, status, &read, polls, oracle) {
                called.answered = Some(polls);
            }
            if polls == 0 && read.answer.is_some() && read.first_event != read.last_event {
                called.replay_from = read.first_event;
            }
        }
    }
    called
}

/// Resumes a call's stream, answered already, from `from` (before its
/// answer): the server replays the answer, which must be the call's own. The
/// guard must not take it for the answer to another request that reused
/// `id: 1` and still runs (that one's stream was closed early).
async fn replay_answer(setup: &Setup, session: &str, marker: &str, from: &str, oracle: &Oracle) {
    match tokio::time::timeout(setup.client_bound, read(resume(session, from))).await {
        Ok(Ok((status, more))) => {
            oracle.note(&format!(
                "{marker}: replayed from {from}: {status}, answer {}",
                more.answer.is_some()
            ));
            // A gateway's stand-in (the proxy's `502` when the upstream is
            // unreachable: a JSON-RPC error with `id: null`, a `GET` having
            // none) carries no answer of the server's.
            let stand_in = status.is_server_error() && setup.faults;
            if let Some(answer) = more.answer.filter(|_| !stand_in) {
                let got = answer["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or("");
                if answer["id"] != json!(1) || (answer.get("result").is_some() && got != marker) {
                    oracle.violation(format!(
                        "{marker}: a replay of its stream carried another answer: {answer}"
                    ));
                }
            }
        }
        Ok(Err(error)) => oracle.note(&format!("{marker}: replay failed: {error}")),
        Err(_) if setup.faults => oracle.note(&format!("{marker}: replay did not end")),
        Err(_) => oracle.violation(format!("{marker}: its replay did not end")),
    }
}

/// Whether the answer is the request's own: its id, its marker. True when
/// it is the server's result (an error here is a stand-in's or a refusal:
/// the proxy's `502` leaves the id abandoned).
fn judge(
    marker: &str,
    id: &Value,
    status: StatusCode,
    read: &Read,
    polls: u32,
    oracle: &Oracle,
) -> bool {
    let Some(answer) = &read.answer else {
        if oracle.was_cancelled(marker) {
            oracle.ended(marker, Outcome::CancelledByAnother);
            return false;
        }
        oracle.violation(format!(
            "{marker}: {status} with no answer after {polls} polls: {}",
            read.text
        ));
        return false;
    };
    if answer["id"] != *id {
        oracle.violation(format!("{marker}: an answer with id {}", answer["id"]));
        return false;
    }
    if answer.get("error").is_some() {
        oracle.ended(marker, Outcome::Error(status.as_u16()));
        return false;
    }
    let got = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("");
    if got != marker {
        oracle.violation(format!(
            "{marker}: cross-wired: received the answer to {got}"
        ));
        return false;
    }
    if polls > 0 {
        oracle.ended(marker, Outcome::Resumed);
    } else {
        oracle.ended(marker, Outcome::Answered);
    }
    true
}

/// Answers the server's requests (in its id space, where `1` is not the
/// client's `1`): each answer must reach the server as sent, `202`.
async fn answer_server(session: &str, asked: &[Value], quirks: &Quirks, oracle: &Oracle) {
    for id in asked {
        let answer = json!({
            "jsonrpc": "2.0", "id": id,
            "result": {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "sim"}
        });
        match post(Some(session), &answer).await {
            Ok(response) => {
                let status = response.status();
                oracle.note(&format!("answered the server's request {id}: {status}"));
                let unknown = response.headers().contains_key(UNKNOWN_SESSION);
                if status != StatusCode::ACCEPTED
                    && !unknown
                    && !status.is_server_error()
                    && !timed_out_inside(quirks, status)
                {
                    oracle.violation(format!(
                        "an answer to the server's request {id} got {status}"
                    ));
                }
            }
            Err(error) => oracle.note(&format!(
                "answering the server's request {id} failed: {error}"
            )),
        }
    }
}

/// Resumes a stream: `GET` with `Last-Event-ID`.
async fn resume(
    session: &str,
    last_event: &str,
) -> Result<Response<Incoming>, Box<dyn std::error::Error>> {
    let request = Request::get("/mcp")
        .header("host", format!("{GUARD_HOST}:{GUARD_PORT}"))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .header("last-event-id", last_event)
        .body(Full::new(Bytes::new()))?;
    send(request).await
}

/// POSTs `message` to the guard on a new connection.
pub async fn post(
    session: Option<&str>,
    message: &Value,
) -> Result<Response<Incoming>, Box<dyn std::error::Error>> {
    post_raw(session, message.to_string(), &[]).await
}

/// POSTs `body` as written, with `extra` headers.
pub async fn post_raw(
    session: Option<&str>,
    body: String,
    extra: &[(&str, &str)],
) -> Result<Response<Incoming>, Box<dyn std::error::Error>> {
    let mut request = Request::post("/mcp")
        .header("host", format!("{GUARD_HOST}:{GUARD_PORT}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    send(request.body(Full::new(Bytes::from(body)))?).await
}

/// Sends `request` to the guard on a new connection, closed when the
/// response (and its body) is dropped.
async fn send(
    request: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, Box<dyn std::error::Error>> {
    let stream = turmoil::net::TcpStream::connect((GUARD_HOST, GUARD_PORT)).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::task::spawn_local(connection);
    Ok(within_read_timeout(sender.send_request(request)).await??)
}
