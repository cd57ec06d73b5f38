//! Reading JSON-RPC responses out of answers: a JSON body (an object or a
//! batch), or an SSE stream read only as far as its first response.

use serde_json::Value;

/// The JSON-RPC response in a body: the object itself, or the first one of
/// a batch.
pub(super) fn first_response(value: Value) -> Option<Value> {
    match value {
        Value::Array(items) => items.into_iter().find(is_response),
        value => is_response(&value).then_some(value),
    }
}

fn is_response(value: &Value) -> bool {
    value.get("id").is_some() && (value.get("result").is_some() || value.get("error").is_some())
}

/// A minimal SSE reader: `data:` lines joined per event; everything else
/// (ids, comments, retry) ignored. Bounded by the body cap of its caller.
#[derive(Default)]
pub(super) struct EventReader {
    line: Vec<u8>,
    data: Vec<u8>,
}

impl EventReader {
    /// Feeds bytes; returns the first JSON-RPC response an event completed.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Option<Value> {
        for &byte in bytes {
            if byte != b'\n' {
                self.line.push(byte);
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            if line.is_empty() {
                let data = std::mem::take(&mut self.data);
                let message = serde_json::from_slice::<Value>(&data)
                    .ok()
                    .and_then(first_response);
                if message.is_some() {
                    return message;
                }
            } else if let Some(value) = line.strip_prefix(b"data:") {
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data
                    .extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_anywhere() {
        let stream = b": keep-alive\r\n\r\nid: 1\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\r\n\r\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":7,\"result\":{}}\n\n";
        for split in 0..stream.len() {
            let mut reader = EventReader::default();
            let first = reader.feed(&stream[..split]);
            let message = first.or_else(|| reader.feed(&stream[split..]));
            assert_eq!(message.expect("a response")["id"], 7, "split at {split}");
        }
    }
}
