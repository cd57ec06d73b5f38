//! What the proxy tests ask of a call: one `echo` through the proxy, judged
//! on the JSON-RPC answer alone (status, id and result).

use std::time::Duration;

use serde_json::Value;

use super::client::{Column, Counted, Session, Tally};
use super::ids::find_response;
use super::server::McpServer;
use super::{HANG_TIMEOUT, OK_TIMEOUT};

/// What one `tools/call` got back.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its own result with its own id.
    Own,
    /// A result, but not its own (another call's, or its id was wrong).
    Wrong(String),
    /// A JSON-RPC error.
    Rejected {
        /// HTTP status.
        status: u16,
        /// The error's `id`.
        id: Value,
        /// The error's `code`.
        code: i64,
    },
    /// No answer within the bound.
    Hung,
    /// Anything else.
    Other(String),
}

impl Counted for Outcome {
    fn column(&self) -> Column {
        match self {
            Outcome::Own => Column::Own,
            Outcome::Wrong(_) => Column::Wrong,
            Outcome::Rejected { .. } => Column::Rejected,
            Outcome::Hung => Column::Hung,
            Outcome::Other(_) => Column::Other,
        }
    }
}

impl Session {
    /// `tools/call echo` with JSON-RPC id `id`; bounded by `within`.
    pub async fn echo(
        &self,
        id: Value,
        sentinel: &str,
        delay_ms: u64,
        within: Duration,
    ) -> Outcome {
        self.echo_with(id, sentinel, delay_ms, within, &[]).await
    }

    /// [`Self::echo`] with these request headers in place of the usual
    /// ones of the same names.
    pub async fn echo_with(
        &self,
        id: Value,
        sentinel: &str,
        delay_ms: u64,
        within: Duration,
        headers: &[(&'static str, &'static str)],
    ) -> Outcome {
        let message = serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": "echo", "arguments": { "sentinel": sentinel, "delay_ms": delay_ms } }
        });
        let exchange = async {
            let mut request = self.post_json(message).build()?;
            for (name, value) in headers {
                request.headers_mut().insert(
                    reqwest::header::HeaderName::from_static(name),
                    reqwest::header::HeaderValue::from_static(value),
                );
            }
            let response = self.http.execute(request).await?;
            let status = response.status().as_u16();
            let text = response.text().await?;
            anyhow::Ok((status, text))
        };
        let (status, text) = match tokio::time::timeout(within, exchange).await {
            Err(_) => return Outcome::Hung,
            Ok(Err(error)) => return Outcome::Other(format!("transport error: {error:#}")),
            Ok(Ok(answer)) => answer,
        };
        let Some(reply) = find_response(&text) else {
            return Outcome::Other(format!("{status}: no JSON-RPC response in {text:?}"));
        };
        if let Some(error) = reply.get("error") {
            return Outcome::Rejected {
                status,
                id: reply["id"].clone(),
                code: error["code"].as_i64().unwrap_or_default(),
            };
        }
        let result = reply["result"].to_string();
        if status == 200 && reply["id"] == id && result.contains(&format!("\"ECHO:{sentinel}\"")) {
            Outcome::Own
        } else {
            Outcome::Wrong(format!("id {} result {result}", reply["id"]))
        }
    }
}

/// The seed's pair through a proxy: call A (`id: 1`) is held at the upstream
/// while call B (`id: 1` too) is sent; then A is released and must get its
/// own result. Returns what B got.
pub async fn duplicate_while_held(
    upstream: &McpServer,
    session: &Session,
) -> anyhow::Result<Outcome> {
    upstream.gates.hold("A");
    let a = tokio::spawn({
        let session = session.clone();
        async move { session.echo(serde_json::json!(1), "A", 0, OK_TIMEOUT).await }
    });
    upstream.wait_started(&["A"]).await?;
    let b = session.echo(serde_json::json!(1), "B", 0, OK_TIMEOUT).await;
    upstream.gates.release("A");
    anyhow::ensure!(a.await? == Outcome::Own, "A did not get its own result");
    Ok(b)
}

/// How many calls the seed's burst makes.
pub const BURST: usize = 12;

/// One sentinel per call of a burst.
pub fn sentinels(prefix: &str) -> Vec<String> {
    (0..BURST).map(|i| format!("{prefix}_{i:02}")).collect()
}

/// The seed's control: 12 concurrent `id: 1` calls in `session` against a
/// server with no guard in front; at least one gets another's result or no
/// answer (`what` names the setup in the printed tally).
pub async fn control_burst(session: &Session, what: &str) -> anyhow::Result<()> {
    let names = sentinels("control");
    let calls = names.iter().enumerate().map(|(i, sentinel)| {
        // Work times spread over 0..275 ms, out of arrival order.
        let delay = ((i * 7) % BURST) as u64 * 25;
        session.echo(serde_json::json!(1), sentinel, delay, HANG_TIMEOUT)
    });
    let outcomes = futures::future::join_all(calls).await;
    let tally = Tally::of(&outcomes);
    println!("control burst ({what}, 12 x id 1): {tally:?}");
    anyhow::ensure!(
        tally.wrong + tally.hung >= 1,
        "the bare server did not cross-wire: {outcomes:?}"
    );
    Ok(())
}
