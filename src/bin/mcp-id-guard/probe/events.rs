//! Reading an SSE stream as the HTML standard's event-stream parser does,
//! without holding it: lines end with CR, LF or CRLF (split anywhere between
//! chunks), a leading byte-order mark is skipped, `data` lines stream into a
//! [`Scanner`] as they arrive (their JSON is never held whole), and the
//! stream's last event id and `retry` are kept, so that a stream the server
//! closes before its answer can be resumed (SEP-1699: `GET` with
//! `Last-Event-ID`).
//!
//! Written by hand, beside the [`Scanner`]: the SSE crates hold each
//! event's data whole (an 8 MiB event is 8 MiB), and none feeds it to an
//! incremental reader.

use std::time::Duration;

use http::HeaderValue;

use super::scan::{Answer, Scanner};

/// The longest event id the probe sends back; a longer one cannot be
/// resumed from.
const MAX_EVENT_ID_BYTES: usize = 1024;
/// Field names the probe reads are shorter.
const MAX_FIELD_NAME_BYTES: usize = 8;
/// `retry` values past this many digits are ignored.
const MAX_RETRY_DIGITS: usize = 10;

/// The field of the line being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Data,
    Id,
    Retry,
    Ignored,
}

/// The last event id a stream gave, as far as the probe can send it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EventId {
    /// None, or the empty id (nothing to resume from).
    None,
    Id(Vec<u8>),
    /// Longer than [`MAX_EVENT_ID_BYTES`].
    TooLong,
}

/// The reader; see the [module docs](self).
#[derive(Debug)]
pub(super) struct EventReader {
    /// Bytes of a leading byte-order mark matched so far; 3 once past it
    /// (or once something else came first).
    bom: u8,
    /// The last byte was a CR: an LF right after it ends no other line.
    after_cr: bool,
    /// No byte on this line yet.
    line_empty: bool,
    /// The field name so far (while `in_value` is false).
    name: Vec<u8>,
    in_value: bool,
    /// The value's first byte is still to come (a space there is skipped).
    value_start: bool,
    field: Field,
    /// This line is a comment.
    comment: bool,
    /// The event's data, read as it comes.
    data: Scanner,
    /// The event has had a data line (the next one is joined with LF).
    has_data: bool,
    /// This line's id value.
    id_line: Vec<u8>,
    id_line_long: bool,
    id_line_nul: bool,
    /// The standard's "last event ID buffer", and what the last dispatched
    /// event set.
    id_buffer: EventId,
    last_event_id: EventId,
    retry_digits: Vec<u8>,
    retry_valid: bool,
    /// The last `retry` the stream gave.
    retry: Option<Duration>,
}

impl Default for EventReader {
    fn default() -> Self {
        Self {
            bom: 0,
            after_cr: false,
            line_empty: true,
            name: Vec::new(),
            in_value: false,
            value_start: false,
            field: Field::Ignored,
            comment: false,
            data: Scanner::default(),
            has_data: false,
            id_line: Vec::new(),
            id_line_long: false,
            id_line_nul: false,
            id_buffer: EventId::None,
            last_event_id: EventId::None,
            retry_digits: Vec::new(),
            retry_valid: true,
            retry: None,
        }
    }
}

impl EventReader {
    /// Feeds bytes; returns the first JSON-RPC response an event completed.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Option<Answer> {
        let mut rest = bytes;
        while let Some((&byte, tail)) = rest.split_first() {
            if self.bom < 3 {
                const BOM: [u8; 3] = [0xef, 0xbb, 0xbf];
                if byte == BOM[usize::from(self.bom)] {
                    self.bom += 1;
                    rest = tail;
                    continue;
                }
                // Not a byte-order mark after all: the bytes matched so far
                // are part of the first line.
                let matched = usize::from(self.bom);
                self.bom = 3;
                for &earlier in &BOM[..matched] {
                    if let Some(answer) = self.byte(earlier) {
                        return Some(answer);
                    }
                }
            }
            if self.bulk() {
                // The rest of the line goes to the data reader (or nowhere)
                // in one piece, up to its end.
                let end = memchr::memchr2(b'\r', b'\n', rest).unwrap_or(rest.len());
                if end > 0 {
                    let (span, after) = rest.split_at(end);
                    self.after_cr = false;
                    if self.field == Field::Data && !self.comment {
                        self.data.feed(span);
                    }
                    rest = after;
                    continue;
                }
            }
            if let Some(answer) = self.byte(byte) {
                return Some(answer);
            }
            rest = tail;
        }
        None
    }

    /// Whether the rest of the line can be passed on whole: a comment, or
    /// the value of a data or ignored field past its first byte.
    fn bulk(&self) -> bool {
        self.comment
            || (self.in_value
                && !self.value_start
                && matches!(self.field, Field::Data | Field::Ignored))
    }

    /// The id of the last event the stream dispatched.
    pub(super) fn last_event_id(&self) -> &EventId {
        &self.last_event_id
    }

    /// The last `retry` (reconnection time) the stream gave.
    pub(super) fn retry(&self) -> Option<Duration> {
        self.retry
    }

    fn byte(&mut self, byte: u8) -> Option<Answer> {
        let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
        match byte {
            b'\n' if after_cr => None,
            b'\n' | b'\r' => self.line_ended(),
            _ => {
                self.line_byte(byte);
                None
            }
        }
    }

    fn line_byte(&mut self, byte: u8) {
        let first = std::mem::replace(&mut self.line_empty, false);
        if first && byte == b':' {
            self.comment = true;
        }
        if self.comment {
            return;
        }
        if !self.in_value {
            if byte == b':' {
                self.in_value = true;
                self.value_start = true;
                self.field_known();
            } else if self.name.len() <= MAX_FIELD_NAME_BYTES {
                self.name.push(byte);
            }
            return;
        }
        if std::mem::replace(&mut self.value_start, false) && byte == b' ' {
            return;
        }
        self.value_byte(byte);
    }

    fn field_named(&self) -> Field {
        match self.name.as_slice() {
            b"data" => Field::Data,
            b"id" => Field::Id,
            b"retry" => Field::Retry,
            _ => Field::Ignored,
        }
    }

    /// A line's field is known: a data line is joined to the event's
    /// earlier ones with an LF (white space to the JSON reader).
    fn field_known(&mut self) {
        self.field = self.field_named();
        if self.field == Field::Data && std::mem::replace(&mut self.has_data, true) {
            self.data.feed(b"\n");
        }
    }

    fn value_byte(&mut self, byte: u8) {
        match self.field {
            Field::Data => {
                self.data.feed(&[byte]);
            }
            Field::Id => {
                if byte == 0 {
                    self.id_line_nul = true;
                } else if self.id_line.len() < MAX_EVENT_ID_BYTES {
                    self.id_line.push(byte);
                } else {
                    self.id_line_long = true;
                }
            }
            Field::Retry => {
                if byte.is_ascii_digit() && self.retry_digits.len() < MAX_RETRY_DIGITS {
                    self.retry_digits.push(byte);
                } else {
                    self.retry_valid = false;
                }
            }
            Field::Ignored => {}
        }
    }

    fn line_ended(&mut self) -> Option<Answer> {
        if self.line_empty {
            return self.dispatch();
        }
        if !self.comment && !self.in_value {
            // A line without a colon: the whole line names the field, and
            // its value is empty.
            self.field_known();
            self.value_start = false;
        }
        if !self.comment {
            match self.field {
                Field::Data => {}
                Field::Id if !self.id_line_nul => {
                    self.id_buffer = if self.id_line_long {
                        EventId::TooLong
                    } else if self.id_line.is_empty() {
                        EventId::None
                    } else {
                        EventId::Id(self.id_line.clone())
                    };
                }
                Field::Retry if self.retry_valid && !self.retry_digits.is_empty() => {
                    let millis = std::str::from_utf8(&self.retry_digits)
                        .ok()
                        .and_then(|digits| digits.parse().ok())
                        .unwrap_or(u64::MAX);
                    self.retry = Some(Duration::from_millis(millis));
                }
                _ => {}
            }
        }
        self.line_empty = true;
        self.comment = false;
        self.name.clear();
        self.in_value = false;
        self.value_start = false;
        self.field = Field::Ignored;
        self.id_line.clear();
        self.id_line_long = false;
        self.id_line_nul = false;
        self.retry_digits.clear();
        self.retry_valid = true;
        None
    }

    /// A blank line: the event is complete.
    fn dispatch(&mut self) -> Option<Answer> {
        self.last_event_id = self.id_buffer.clone();
        let mut data = std::mem::take(&mut self.data);
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        data.finish()
    }
}

/// `Last-Event-ID` for resuming after `id`, or why there is none.
pub(super) fn resume_header(id: &EventId) -> Result<HeaderValue, &'static str> {
    match id {
        EventId::None => Err("the stream gave no event id to resume from"),
        EventId::TooLong => Err("the stream's event id is too long to send back"),
        EventId::Id(id) => HeaderValue::from_bytes(id)
            .map_err(|_| "the stream's event id cannot be sent back as a header"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn first_answer(stream: &[u8], split: usize) -> (Option<Answer>, EventReader) {
        let mut reader = EventReader::default();
        let first = reader.feed(&stream[..split]);
        let answer = first.or_else(|| reader.feed(&stream[split..]));
        (answer, reader)
    }

    #[test]
    fn every_line_ending_split_anywhere() {
        for ending in ["\n", "\r", "\r\n"] {
            let stream = [
                "\u{feff}: keep-alive",
                "",
                "id: 1",
                r#"data: {"jsonrpc":"2.0","method":"x"}"#,
                "",
                "event: message",
                r#"data: {"jsonrpc":"2.0","#,
                r#"data: "id":7,"result":{}}"#,
                "",
                "",
            ]
            .join(ending);
            let stream = stream.as_bytes();
            for split in 0..stream.len() {
                let (answer, _) = first_answer(stream, split);
                assert_eq!(
                    answer.expect("a response").id,
                    json!(7),
                    "{ending:?} split at {split}"
                );
            }
        }
    }

    #[test]
    fn ids_and_retry_are_kept_for_resuming() {
        let stream = b"id: prime-1\r\nretry: 250\r\ndata:\r\n\r\nid: p2\rretry: x\r\r";
        let (answer, reader) = first_answer(stream, 9);
        assert_eq!(answer, None);
        assert_eq!(reader.last_event_id(), &EventId::Id(b"p2".to_vec()));
        assert_eq!(reader.retry(), Some(Duration::from_millis(250)));
        assert_eq!(
            resume_header(reader.last_event_id()).unwrap(),
            HeaderValue::from_static("p2")
        );
        // An id seen on a line of an event that never ended is not the
        // stream's yet.
        let (_, reader) = first_answer(b"id: 1\n\nid: 2\ndata: x", 3);
        assert_eq!(reader.last_event_id(), &EventId::Id(b"1".to_vec()));
        let long = format!("id: {}\n\n", "x".repeat(2000));
        let (_, reader) = first_answer(long.as_bytes(), 10);
        assert_eq!(reader.last_event_id(), &EventId::TooLong);
        assert!(resume_header(reader.last_event_id()).is_err());
        let (_, reader) = first_answer(b"id\n\n", 1);
        assert_eq!(reader.last_event_id(), &EventId::None);
    }

    #[test]
    fn data_without_a_space_or_colon() {
        let (answer, _) = first_answer(b"data:{\"id\":1,\ndata\ndata:\"result\":{}}\n\n", 5);
        assert_eq!(answer.unwrap().id, json!(1));
    }
}
