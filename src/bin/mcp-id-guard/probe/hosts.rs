//! `host` and `origin`: whether the server answers a request that names a
//! foreign host (a DNS-rebinding attack: a web page's script reaching a
//! server on the victim's machine or network) or comes from a foreign web
//! origin. Accepting them is not the id bug; it is reported as a warning.

use http::header::{HeaderName, HeaderValue, HOST, ORIGIN};
use serde_json::json;

use super::client::Client;
use super::judge::{judge, Received};
use super::report::{Check, Verdict};
use super::Shapes;

/// The foreign host name both requests use.
const FOREIGN: &str = "evil.example";

/// One `ping` with a rebound `Host`, one with a foreign `Origin`.
pub(super) async fn checks(client: &Client, shapes: &Shapes) -> Vec<Check> {
    let host = format!("{FOREIGN}:{}", client.target().port);
    let origin = format!("http://{FOREIGN}");
    let mut checks = Vec::new();
    for (name, id, header, shown, value) in [
        ("host", 4001, HOST, "Host", host),
        ("origin", 4002, ORIGIN, "Origin", origin),
    ] {
        let shown = format!("{shown}: {value}");
        checks.push(one(client, shapes, name, id, (header, &value), &shown).await);
    }
    checks
}

async fn one(
    client: &Client,
    shapes: &Shapes,
    name: &'static str,
    id: u64,
    (header, value): (HeaderName, &str),
    shown: &str,
) -> Check {
    let Ok(header_value) = HeaderValue::from_str(value) else {
        return Check::plain(
            name,
            Verdict::Error,
            format!("{value:?} is no header value"),
        );
    };
    let message = json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
    let reply = client.call(&message, &[(header, header_value)]).await;
    match judge(&reply, &json!(id), &shapes.ping) {
        Received::Own => Check::plain(
            name,
            Verdict::Warn,
            format!("accepted a ping with {shown} (a browser page could reach this server)"),
        ),
        Received::Refused { status, code } => {
            let code = code.map_or_else(String::new, |code| format!(", code {code}"));
            Check::plain(
                name,
                Verdict::Ok,
                format!("refused {shown}: HTTP {status}{code}"),
            )
        }
        Received::ServerError { status, .. } => Check::plain(
            name,
            Verdict::Ok,
            format!("{shown} not served: HTTP {status}"),
        ),
        Received::Unfinished => Check::plain(
            name,
            Verdict::Error,
            "not judged: the probe ran out of time",
        ),
        Received::Hung => Check::plain(name, Verdict::Ok, format!("no answer to {shown}")),
        Received::Lost(why) => {
            Check::plain(name, Verdict::Ok, format!("{shown} not answered: {why}"))
        }
        seen => Check::plain(name, Verdict::Error, format!("{shown}: {seen:?}")),
    }
}
