//! Simulated Claude-style clients: one session per client, pooled across
//! many concurrent conversations, every `tools/call` with `id: 1`, each on
//! a connection of its own; each call carries a payload marker naming its
//! client, conversation and turn, which the server's tool echoes.

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
use crate::world::{Setup, GUARD_HOST, GUARD_PORT};

/// One client: its session, then its conversations, all at once.
pub async fn run(name: String, setup: Setup, seed: u64, oracle: Oracle) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(seed);
    let session = initialize(&name, &setup, &oracle).await?;
    let mut conversations = tokio::task::JoinSet::new();
    for conversation in 0..setup.conversations {
        let mut rng = StdRng::seed_from_u64(rng.random());
        let (name, session, setup, oracle) =
            (name.clone(), session.clone(), setup.clone(), oracle.clone());
        conversations.spawn_local(async move {
            // Conversations start spread over a few seconds.
            let start = rng.random_range(0..setup.max_think_ms);
            tokio::time::sleep(Duration::from_millis(start)).await;
            for turn in 0..setup.turns {
                let marker = format!("{name}/conversation-{conversation}/turn-{turn}");
                let ms = rng.random_range(0..=setup.max_tool_ms);
                call(&setup, &session, &marker, ms, &oracle).await;
                let think = rng.random_range(0..setup.max_think_ms);
                tokio::time::sleep(Duration::from_millis(think)).await;
            }
        });
    }
    while conversations.join_next().await.is_some() {}
    Ok(())
}

/// `initialize` and `notifications/initialized`, through the guard: the
/// session id.
async fn initialize(name: &str, setup: &Setup, oracle: &Oracle) -> turmoil::Result<String> {
    let message = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": name, "version": "0"}}
    });
    let response = tokio::time::timeout(setup.client_bound, send(None, &message)).await??;
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| format!("{name}: initialize got {} and no session", response.status()))?;
    let _ = response.into_body().collect().await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let response = tokio::time::timeout(
        setup.client_bound,
        send(Some(&session), &initialized),
    )
    .await??;
    if response.status() != StatusCode::ACCEPTED {
        oracle.violation(format!(
            "{name}: notifications/initialized got {}",
            response.status()
        ));
    }
    Ok(session)
}

/// One `tools/call` with `id: 1` on a new connection, judged.
async fn call(setup: &Setup, session: &str, marker: &str, ms: u64, oracle: &Oracle) {
    let message = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"marker": marker, "ms": ms}}
    });
    let exchange = async {
        let response = send(Some(session), &message).await?;
        let status = response.status();
        let sse = response
            .headers()
            .get("content-type")
            .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error>>((status, sse, body))
    };
    match tokio::time::timeout(setup.client_bound, exchange).await {
        Err(_) => oracle.violation(format!(
            "{marker}: did not end within {:?} (tool {ms} ms)",
            setup.client_bound
        )),
        Ok(Err(error)) => oracle.violation(format!("{marker}: failed: {error}")),
        Ok(Ok((status, sse, body))) => judge(marker, status, sse, &body, oracle),
    }
}

/// Whether the answer is the request's own: its id, its marker.
fn judge(marker: &str, status: StatusCode, sse: bool, body: &Bytes, oracle: &Oracle) {
    let messages: Vec<Value> = if sse {
        sse_messages(body)
    } else {
        serde_json::from_slice(body).into_iter().collect()
    };
    let Some(answer) = messages
        .iter()
        .find(|message| message.get("result").is_some() || message.get("error").is_some())
    else {
        oracle.violation(format!(
            "{marker}: {status} with no answer: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ));
        return;
    };
    if answer["id"] != json!(1) {
        oracle.violation(format!("{marker}: an answer with id {}", answer["id"]));
        return;
    }
    if answer.get("error").is_some() {
        oracle.ended(Outcome::Error(status.as_u16()));
        return;
    }
    let got = answer["result"]["content"][0]["text"].as_str().unwrap_or("");
    if got == marker {
        oracle.ended(Outcome::Answered);
    } else {
        oracle.violation(format!("{marker}: cross-wired: received the answer to {got}"));
    }
}

/// The JSON messages of an SSE body's `data` fields.
fn sse_messages(body: &Bytes) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            (!data.is_empty())
                .then(|| serde_json::from_str(&data.join("\n")).ok())
                .flatten()
        })
        .collect()
}

/// POSTs `message` to the guard on a new connection.
async fn send(
    session: Option<&str>,
    message: &Value,
) -> Result<Response<Incoming>, Box<dyn std::error::Error>> {
    let stream = turmoil::net::TcpStream::connect((GUARD_HOST, GUARD_PORT)).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::task::spawn_local(connection);
    let mut request = Request::post("/mcp")
        .header("host", format!("{GUARD_HOST}:{GUARD_PORT}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let request = request.body(Full::new(Bytes::from(message.to_string())))?;
    Ok(sender.send_request(request).await?)
}
