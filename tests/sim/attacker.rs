//! The slow-body attacker (#42): connections that hold bodies at just above
//! the body pace's minimum rate, all the while the clients run.

use std::time::Duration;

use crate::oracle::Oracle;
use crate::world::{GUARD_HOST, GUARD_PORT};

/// How many bodies the slow-body attacker holds at once: together they
/// announce the guard's whole 64 MiB body budget.
const ATTACKERS: usize = 16;

/// The slow-body attacker: [`ATTACKERS`] connections, each a POST announcing
/// the 4 MiB size cap and sending 250 bytes a second (above the body pace's
/// minimum rate), opened again whenever the guard closes one, until
/// `clients_done`. While a `Content-Length` was held for up front, these
/// bodies held the whole budget and every client request got `503`.
pub async fn hold_bodies(clients_done: &std::sync::atomic::AtomicBool, oracle: &Oracle) {
    let mut attackers = tokio::task::JoinSet::new();
    for attacker in 0..ATTACKERS {
        attackers.spawn_local(hold_one_body(attacker));
    }
    while !clients_done.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    attackers.abort_all();
    while attackers.join_next().await.is_some() {}
    oracle.note("attacker: stopped");
}

/// One attacking connection after another, each sending its body slowly
/// until the guard closes it.
async fn hold_one_body(attacker: usize) {
    use tokio::io::AsyncWriteExt as _;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {GUARD_HOST}:{GUARD_PORT}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-session-id: attack-{attacker}\r\n\
         content-length: {}\r\n\r\n{{",
        4 * 1024 * 1024
    );
    loop {
        if let Ok(mut stream) = turmoil::net::TcpStream::connect((GUARD_HOST, GUARD_PORT)).await {
            if stream.write_all(head.as_bytes()).await.is_ok() {
                while stream.write_all(&[b' '; 250]).await.is_ok() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
