//! The tests' one reader of `text/event-stream` bodies.
//!
//! It follows the WHATWG event-stream rules the guard itself must follow: a
//! line ends at CRLF, LF or a bare CR; an event ends at a blank line; `data`
//! lines are joined with `\n`; one space after the colon is dropped; comment
//! lines and unknown fields are ignored. Only complete events (followed by a
//! blank line) are returned, so a body read in chunks is parsed again whole.

/// One SSE event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event {
    /// The `id:` field.
    pub id: Option<String>,
    /// The `event:` field.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
    /// The `retry:` field.
    pub retry: Option<String>,
}

/// The complete lines of `text` and whether a blank line ends them. A CR at
/// the very end counts as a line end: if an LF follows in a later chunk, the
/// whole body is parsed again and the pair counts once.
fn lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let bytes = text.as_bytes();
    let (mut start, mut at) = (0, 0);
    while at < bytes.len() {
        match bytes[at] {
            b'\n' => {
                lines.push(&text[start..at]);
                at += 1;
                start = at;
            }
            b'\r' => {
                lines.push(&text[start..at]);
                at += if bytes.get(at + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = at;
            }
            _ => at += 1,
        }
    }
    // What follows the last line end is an unfinished line: not returned.
    lines
}

/// The complete events of an SSE body (those followed by a blank line),
/// skipping blocks that carry no field (comments such as keep-alives).
pub fn events(text: &str) -> Vec<Event> {
    let mut events = Vec::new();
    let mut event = Event::default();
    let mut data: Vec<&str> = Vec::new();
    let mut any = false;
    for line in lines(text) {
        if line.is_empty() {
            if any {
                event.data = data.join("\n");
                events.push(std::mem::take(&mut event));
            }
            data.clear();
            any = false;
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => event.id = Some(value.to_owned()),
            "event" => event.event = Some(value.to_owned()),
            "data" => data.push(value),
            "retry" => event.retry = Some(value.to_owned()),
            _ => continue,
        }
        any = true;
    }
    events
}

/// The `data` of each complete event.
pub fn data(text: &str) -> Vec<String> {
    events(text).into_iter().map(|event| event.data).collect()
}

/// The JSON-RPC responses among the complete events' data.
pub fn responses(text: &str) -> Vec<String> {
    data(text)
        .into_iter()
        .filter(|data| super::ids::is_response(data))
        .collect()
}

/// Reads from an SSE response until one whole event has arrived; returns the
/// text read so far.
pub async fn first_event(response: &mut reqwest::Response) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    loop {
        let text = std::str::from_utf8(&bytes)?;
        if !events(text).is_empty() {
            return Ok(text.to_owned());
        }
        let chunk = response
            .chunk()
            .await?
            .ok_or_else(|| anyhow::anyhow!("stream ended before a whole event: {text:?}"))?;
        bytes.extend_from_slice(&chunk);
    }
}
