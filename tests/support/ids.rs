//! Reading JSON-RPC ids and responses the way the tests compare them: as the
//! exact JSON text that was written.

use std::collections::BTreeMap;

use mcp_id_guard::inner::ServerSideId;
use serde_json::value::RawValue;
use serde_json::Value;

use super::sse;

/// The exact JSON text of a message's top-level `id`, if it is a JSON object
/// with one.
pub fn raw_id(json: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    let envelope: Envelope<'_> = serde_json::from_str(json).ok()?;
    envelope.id.map(|id| id.get().to_owned())
}

/// The exact JSON text of the top-level `id` of a message the test knows
/// has one, `null` included (panics otherwise). [`raw_id`] reads `null` as
/// no id.
#[track_caller]
pub fn id_text(body: &[u8]) -> String {
    let message: BTreeMap<String, Box<RawValue>> =
        serde_json::from_slice(body).expect("a JSON object");
    message["id"].get().to_owned()
}

/// Whether an id's JSON text is a server-side id minted by the guard.
pub fn is_server_side(id: &str) -> bool {
    ServerSideId::parse(id).is_some()
}

/// The server-side id an id's JSON text is (asserts it is one).
#[track_caller]
pub fn server_side(raw: &str) -> ServerSideId {
    ServerSideId::parse(raw).unwrap_or_else(|| panic!("not a server-side id: {raw:.80}"))
}

/// Whether `json` is a JSON-RPC response: an object with `result` or `error`.
pub fn is_response(json: &str) -> bool {
    serde_json::from_str::<Value>(json).is_ok_and(|value| is_response_value(&value))
}

fn is_response_value(value: &Value) -> bool {
    value.is_object() && (value.get("result").is_some() || value.get("error").is_some())
}

/// The first JSON-RPC response in a body that is either JSON or an SSE
/// stream (its complete events).
pub fn find_response(body: &str) -> Option<Value> {
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return is_response_value(&value).then_some(value);
    }
    sse::events(body)
        .into_iter()
        .filter_map(|event| serde_json::from_str::<Value>(&event.data).ok())
        .find(is_response_value)
}
