//! The two checks that send pairs of requests sharing one id, both at once:
//! `same-id` (`7` and `7`) and `number-vs-string` (`7` and `"7"`, one id to
//! a server that keys its requests by the id's text). One request of each
//! pair is a `ping`, the other a `tools/list`, so an answer that went to the
//! other request of its pair shows.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::Barrier;

use super::client::{Client, ClientConnection, Reply};
use super::judge::{judge, Received, Scorecard, Shape};
use super::report::{Check, Verdict};
use super::Shapes;

/// Ids of `same-id`: one per pair, above the ids of the session's setup.
const SAME_ID_BASE: u64 = 1000;
/// Ids of `number-vs-string`.
const TEXT_ID_BASE: u64 = 2000;

/// Which ids the two requests of a pair carry.
#[derive(Debug, Clone, Copy)]
pub(super) enum PairIds {
    /// One id for both (`same-id`).
    Same,
    /// `n` and `"n"` (`number-vs-string`): servers that route by `str(id)`
    /// cross-wire them.
    NumberAndString,
}

impl PairIds {
    /// The check's name in the report.
    pub(super) const fn name(self) -> &'static str {
        match self {
            Self::Same => "same-id",
            Self::NumberAndString => "number-vs-string",
        }
    }

    /// The ids of pair `pair`: the ping's, then tools/list's.
    fn of(self, pair: usize) -> (Value, Value) {
        match self {
            Self::Same => {
                let id = json!(SAME_ID_BASE + pair as u64);
                (id.clone(), id)
            }
            Self::NumberAndString => {
                let number = TEXT_ID_BASE + pair as u64;
                // Half the pairs give the number to the ping, half to tools/list.
                if pair % 2 == 0 {
                    (json!(number), json!(number.to_string()))
                } else {
                    (json!(number.to_string()), json!(number))
                }
            }
        }
    }
}

/// Many pairs of concurrent requests, their ids as `ids` says.
pub(super) async fn check(
    client: &Client,
    shapes: &Shapes,
    pairs: usize,
    concurrency: usize,
    ids: PairIds,
) -> Check {
    run(
        client,
        shapes,
        pairs,
        concurrency,
        |pair| ids.of(pair),
        ids.name(),
    )
    .await
}

/// Sends `pairs` pairs, `concurrency` pairs in flight at a time. Each wave
/// opens all its connections first, then every request waits at one barrier,
/// so the two requests of a pair (and all pairs of a wave) leave together
/// and the server has many same-id requests in flight at once.
async fn run(
    client: &Client,
    shapes: &Shapes,
    pairs: usize,
    concurrency: usize,
    ids: impl Fn(usize) -> (Value, Value),
    name: &'static str,
) -> Check {
    let mut scorecard = Scorecard::default();
    let mut done = 0;
    let mut stopped = "";
    while done < pairs {
        let wave = (pairs - done).min(concurrency);
        let connections = connect_all(client, 2 * wave).await;
        let connections = match connections {
            Ok(connections) => connections,
            Err(error) => return Check::plain(name, Verdict::Error, error),
        };
        let barrier = Arc::new(Barrier::new(2 * wave));
        let mut tasks = Vec::with_capacity(2 * wave);
        for (index, mut connection) in connections.into_iter().enumerate() {
            let (ping_id, tools_id) = ids(done + index / 2);
            let (method, id, own) = if index % 2 == 0 {
                ("ping", ping_id, shapes.ping.clone())
            } else {
                ("tools/list", tools_id, shapes.tools.clone())
            };
            let message = json!({"jsonrpc": "2.0", "id": id, "method": method});
            let request = client.post(&message, &[]);
            let (client, barrier) = (client.clone(), Arc::clone(&barrier));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let (reply, _) = client.send(&mut connection, request).await;
                (method, id.clone(), judge(&reply, &id, &own))
            }));
        }
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            // Each task is bounded by the client's timeout; a panic is a bug
            // of the probe, reported as a lost answer.
            results.push(task.await.unwrap_or_else(|error| {
                (
                    "?",
                    Value::Null,
                    Received::Lost(format!("probe task failed: {error}")),
                )
            }));
        }
        for (index, pair) in results.chunks(2).enumerate() {
            for (method, id, seen) in pair {
                scorecard.add(seen, || {
                    format!("pair {}: {method} id {id}", done + index + 1)
                });
            }
            let seen: Vec<Received> = pair.iter().map(|(_, _, seen)| seen.clone()).collect();
            scorecard.trial(&seen);
        }
        done += wave;
        // A wave with hung requests has decided the check; more waves would
        // only wait for the same silence.
        if done < pairs && results.iter().any(|(_, _, seen)| *seen == Received::Hung) {
            stopped = " (stopped after this wave: requests hung)";
            break;
        }
    }
    let what = if shapes.ping == shapes.tools {
        // Identical answers: only lost and hung answers can show.
        " (ping and tools/list answers look alike here: swaps cannot show)"
    } else {
        ""
    };
    scorecard.check(
        name,
        &format!(
            "{done} pairs ping + tools/list, {} at a time{what}{stopped}",
            concurrency.min(pairs)
        ),
    )
}

/// Opens `count` connections at once.
async fn connect_all(client: &Client, count: usize) -> Result<Vec<ClientConnection>, String> {
    let opening: Vec<_> = (0..count)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.connect().await })
        })
        .collect();
    let mut connections = Vec::with_capacity(count);
    for opened in opening {
        connections.push(opened.await.map_err(|error| error.to_string())??);
    }
    Ok(connections)
}

/// What a server's answers to a lone `ping` and a lone `tools/list` look
/// like, for telling them apart later.
pub(super) async fn learn(client: &Client) -> Result<Shapes, String> {
    let mut shapes = Vec::new();
    for (id, method) in [(1, "ping"), (2, "tools/list")] {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method});
        match client.call(&message, &[]).await {
            Reply::Answer { answer, .. } if answer.id == json!(id) => {
                shapes.push(answer.shape);
            }
            other => {
                return Err(format!(
                    "a lone {method} (id {id}) got no answer: {other:?}"
                ))
            }
        }
    }
    let tools = shapes.pop().unwrap_or(Shape::Other);
    let ping = shapes.pop().unwrap_or(Shape::Other);
    if let Shape::Error(code) = ping {
        return Err(format!(
            "a lone ping got the error {code}: the server does not answer ping"
        ));
    }
    Ok(Shapes { ping, tools })
}
