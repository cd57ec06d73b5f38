//! Restoring is bound to the session: a response's server-side id is put
//! back to the client's id only if this guard's secret issued it for the
//! session the response belongs to. An upstream that leaks another session's
//! answer (the failure the guard exists for; the TypeScript SDK shipped one,
//! CVE-2026-25536), or forges a server-side id, has it passed on as it wrote
//! it, where a client sees an id it never sent, instead of an answer dressed
//! up as its own.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use mcp_id_guard::guard::GuardRequestBody as RequestBody;
use mcp_id_guard::IdGuardLayer;
use tower::{Layer, Service, ServiceExt};

use crate::support::ids::is_server_side;
use crate::support::wait::within;

type Inner = Request<RequestBody<Full<Bytes>>>;

/// What the scripted server answers a request with: a JSON-RPC id text.
type Script = Arc<Mutex<Vec<String>>>;

/// A server that records the id of every POST it receives and answers each
/// with the id the script gives next (or the id it received), as JSON for a
/// POST and as one SSE event for a GET.
fn scripted(
    seen: Script,
    answers: Script,
) -> impl Service<
    Inner,
    Response = Response<Full<Bytes>>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |request: Inner| {
        let (seen, answers) = (Arc::clone(&seen), Arc::clone(&answers));
        async move {
            let is_get = request.method() == http::Method::GET;
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let received = serde_json::from_slice::<serde_json::Value>(&body)
                .map(|message| message["id"].to_string())
                .ok();
            if let Some(id) = &received {
                seen.lock().unwrap().push(id.clone());
            }
            let next = answers.lock().unwrap().pop();
            let id = next.or(received).unwrap_or_else(|| "null".to_owned());
            let message = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"for":{id}}}}}"#);
            let response = if is_get {
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Full::new(Bytes::from(format!(
                        "id: 9\ndata: {message}\n\n"
                    ))))
            } else {
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(message)))
            };
            Ok(response.unwrap())
        }
    })
}

fn post(session: &str, id: &str) -> Request<Full<Bytes>> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("mcp-session-id", session)
        .body(Full::new(Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{}}}}"#
        ))))
        .unwrap()
}

fn resumed_get(session: &str) -> Request<Full<Bytes>> {
    Request::get("/mcp")
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .header("last-event-id", "8")
        .body(Full::default())
        .unwrap()
}

/// One exchange through `service` (always ready, never failing here).
async fn send<S>(service: &mut S, request: Request<Full<Bytes>>) -> S::Response
where
    S: Service<Request<Full<Bytes>>>,
    S::Error: std::fmt::Debug,
{
    service.ready().await.unwrap().call(request).await.unwrap()
}

async fn text(response: Response<mcp_id_guard::guard::GuardResponseBody<Full<Bytes>>>) -> String {
    let body = within(response.into_body().collect()).await.unwrap();
    String::from_utf8(body.to_bytes().to_vec()).unwrap()
}

/// Session X's request is remapped; the upstream then answers session Y's
/// request with X's live server-side id, and a GET of Y with a forged one.
/// Neither is restored, both are counted; X's own answer still is.
#[tokio::test]
async fn another_sessions_id_and_a_forged_one_are_not_restored() {
    let (seen, answers) = (Script::default(), Script::default());
    let layer = IdGuardLayer::new();
    let mut guard = layer.layer(scripted(Arc::clone(&seen), Arc::clone(&answers)));

    // X: two `1`s in flight, the second goes remapped.
    let first_x = send(&mut guard, post("session-x", "1")).await;
    let second_x = send(&mut guard, post("session-x", "1")).await;
    let x_server_id = seen.lock().unwrap()[1].clone();
    assert!(is_server_side(&x_server_id), "{x_server_id}");
    assert_eq!(
        text(second_x).await,
        r#"{"jsonrpc":"2.0","id":1,"result":{"for":"#.to_owned() + &x_server_id + "}}",
        "X's own answer is restored"
    );

    // Y's remapped `1` is answered with X's server-side id (X's data): a
    // guard that restored it would hand Y X's answer as its own `1`.
    let first_y = send(&mut guard, post("session-y", "1")).await;
    answers.lock().unwrap().push(x_server_id.clone());
    let leaked = send(&mut guard, post("session-y", "1")).await;
    assert!(
        is_server_side(&seen.lock().unwrap()[3]),
        "Y's second 1 went remapped"
    );
    assert_eq!(
        text(leaked).await,
        format!(r#"{{"jsonrpc":"2.0","id":{x_server_id},"result":{{"for":{x_server_id}}}}}"#),
        "another session's server-side id reaches Y as the server wrote it"
    );
    drop(first_y);
    let forged = r#""mcp-id-guard:0123456789abcdef:999999:42""#;
    answers.lock().unwrap().push(forged.to_owned());
    let replayed = send(&mut guard, resumed_get("session-y")).await;
    assert_eq!(
        text(replayed).await,
        format!("id: 9\ndata: {{\"jsonrpc\":\"2.0\",\"id\":{forged},\"result\":{{\"for\":{forged}}}}}\n\n"),
        "a forged server-side id is never restored"
    );
    let stats = layer.stats();
    assert_eq!(
        (stats.restored_total, stats.restore_refused_total),
        (1, 2),
        "{stats:?}"
    );
    drop(first_x);
}

/// Replicas that share the secret restore each other's ids: a stream resumed
/// on another replica gets the client's id back. A replica with another
/// secret does not.
#[tokio::test]
async fn replicas_sharing_the_secret_restore_each_others_ids() {
    let secret = *b"replicas secret!";
    let (seen, answers) = (Script::default(), Script::default());
    let server = scripted(Arc::clone(&seen), Arc::clone(&answers));
    let replica = |layer: IdGuardLayer| layer.rewrite_all_ids(true).layer(server.clone());
    let mut a = replica(IdGuardLayer::with_secret(secret));
    let mut b = replica(IdGuardLayer::with_secret(secret));
    let mut other = replica(IdGuardLayer::new());

    let answered = send(&mut a, post("session-z", "1")).await;
    drop(answered);
    let server_id = seen.lock().unwrap()[0].clone();
    assert!(is_server_side(&server_id), "{server_id}");

    answers.lock().unwrap().push(server_id.clone());
    let resumed = send(&mut b, resumed_get("session-z")).await;
    assert_eq!(
        text(resumed).await,
        format!(
            "id: 9\ndata: {{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"for\":{server_id}}}}}\n\n"
        ),
        "the replica with the same secret restores it"
    );
    answers.lock().unwrap().push(server_id.clone());
    let elsewhere = send(&mut other, resumed_get("session-z")).await;
    assert!(
        text(elsewhere)
            .await
            .contains(&format!("\"id\":{server_id}")),
        "a replica with another secret does not"
    );
}

/// Every answer of a large batch frees its id, past the restorer's default
/// bound of remembered answers (4 096 per text): the bound follows the
/// number of requests the client sent.
#[tokio::test]
async fn every_answer_of_a_large_batch_frees_its_id() {
    let (echo, _probe) = crate::support::inner::echo();
    let layer = IdGuardLayer::new().max_in_flight_per_session(20_000);
    let mut guard = layer.layer(echo);
    let batch: Vec<String> = (0..10_000)
        .map(|n| format!(r#"{{"jsonrpc":"2.0","id":{n},"method":"ping"}}"#))
        .collect();
    let request: Request<Full<Bytes>> = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("mcp-session-id", "session-batch")
        .body(Full::new(Bytes::from(format!("[{}]", batch.join(",")))))
        .unwrap();
    let response = send(&mut guard, request).await;
    let body = within(response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    assert!(body.starts_with(br#"[{"jsonrpc":"2.0","id":0,"result":{}}"#));
    let stats = layer.stats();
    assert_eq!(
        (stats.in_flight_requests, stats.abandoned_ids),
        (0, 0),
        "{stats:?}"
    );
}
