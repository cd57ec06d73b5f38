//! The one incremental SSE rewriter: restores client ids in JSON-RPC responses
//! carried by `text/event-stream` bodies, however the stream is chunked.
//!
//! It works event by event (an event ends at a blank line; lines end with CR,
//! LF or CRLF, and a CR at the end of one chunk may pair with an LF at the start
//! of the next). Complete events are emitted as soon as their blank line
//! arrives; an event's bytes are changed only where a top-level response id is
//! restored. Comments (keep-alives), `id:`/`event:`/`retry:` lines and priming
//! events pass byte-for-byte, and a run of events that does not contain the
//! reserved prefix at all is emitted without being parsed.

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use memchr::memmem;

use crate::edit::splice;
use crate::id::IdKey;
use crate::id::RESERVED_PREFIX;
use crate::restore::{inspect_responses, Responses};

/// Incremental SSE rewriter state.
#[derive(Debug, Default)]
pub(crate) struct SseRewriter {
    /// Bytes of the current, not yet complete event(s).
    pending: BytesMut,
    /// How far `pending` has been scanned for line ends.
    scanned: usize,
    /// Where the line being scanned starts in `pending`.
    line_start: usize,
    /// Ids restored since the last [`take_restored`](Self::take_restored).
    restored: usize,
    /// Keys of the requests whose responses are still to come, when the
    /// stream is watched for them.
    awaited: Vec<IdKey>,
    /// Every awaited response has passed.
    answered: bool,
}

impl SseRewriter {
    /// A rewriter that also watches for the responses to these requests (by
    /// the collision keys of their client ids); see
    /// [`all_answered`](Self::all_answered).
    pub(crate) fn awaiting(awaited: Vec<IdKey>) -> Self {
        Self {
            awaited,
            ..Self::default()
        }
    }

    /// Whether every awaited response has passed: the exchange is over as far
    /// as the client is concerned, even if the server keeps the stream open.
    pub(crate) fn all_answered(&self) -> bool {
        self.answered
    }

    /// Feeds one chunk; returns the bytes of every event it completed, rewritten.
    pub(crate) fn push(&mut self, chunk: Bytes) -> Option<Bytes> {
        if self.pending.is_empty() {
            // Common case: nothing held back, so complete events can be
            // emitted as slices of the chunk itself, without copying.
            let end = self.scan(&chunk, false);
            let complete = chunk.slice(..end);
            self.pending.extend_from_slice(&chunk[end..]);
            self.rebase(end);
            return (!complete.is_empty()).then(|| self.rewrite_events(complete));
        }
        self.pending.extend_from_slice(&chunk);
        let pending = std::mem::take(&mut self.pending);
        let end = self.scan(&pending, false);
        let mut pending = pending;
        let complete = pending.split_to(end).freeze();
        self.pending = pending;
        self.rebase(end);
        (!complete.is_empty()).then(|| self.rewrite_events(complete))
    }

    /// How many ids were restored since the last call.
    pub(crate) fn take_restored(&mut self) -> usize {
        std::mem::take(&mut self.restored)
    }

    /// Rewrites a run of complete events. Events are parsed only when the
    /// run holds the reserved prefix (something to restore) or, while
    /// responses are awaited, a `"result"` or `"error"` key.
    fn rewrite_events(&mut self, events: Bytes) -> Bytes {
        let may_restore = memmem::find(&events, RESERVED_PREFIX.as_bytes()).is_some();
        let may_answer = !self.awaited.is_empty()
            && (memmem::find(&events, b"\"result\"").is_some()
                || memmem::find(&events, b"\"error\"").is_some());
        if !may_restore && !may_answer {
            return events;
        }
        let mut edits = Vec::new();
        for event in event_ranges(&events) {
            let found = inspect_event(&events[event.clone()]);
            edits.extend(found.edits.into_iter().map(|(range, new)| {
                (
                    range.start + event.start..range.end + event.start,
                    fit_data_line(new),
                )
            }));
            for key in found.answered {
                if let Some(position) = self.awaited.iter().position(|awaited| *awaited == key) {
                    self.awaited.swap_remove(position);
                    self.answered = self.awaited.is_empty();
                }
            }
        }
        if edits.is_empty() {
            return events;
        }
        self.restored += edits.len();
        Bytes::from(splice(&events, &edits))
    }

    /// Ends the stream: completes an event whose last terminator was a lone CR,
    /// and passes on unchanged whatever the server never terminated (a client
    /// drops such an event anyway).
    pub(crate) fn finish(&mut self) -> Option<Bytes> {
        let pending = std::mem::take(&mut self.pending);
        // At the end of the stream a final CR is a whole line terminator.
        let end = self.scan(&pending, true);
        self.scanned = 0;
        self.line_start = 0;
        let mut rest = pending;
        let complete = rest.split_to(end).freeze();
        let mut out = BytesMut::from(self.rewrite_events(complete).as_ref());
        out.extend_from_slice(&rest);
        (!out.is_empty()).then(|| out.freeze())
    }

    /// Scans `buffer` from where the last scan stopped; returns the end of the
    /// last complete event in it (0 when there is none).
    fn scan(&mut self, buffer: &[u8], at_end: bool) -> usize {
        let mut last_event_end = 0;
        let mut position = self.scanned;
        while let Some(found) = memchr::memchr2(b'\r', b'\n', &buffer[position..]) {
            let line_end = position + found;
            let terminator_len = match buffer[line_end] {
                b'\r' => match buffer.get(line_end + 1) {
                    None if at_end => 1,
                    // A CR at the very end: it may be the first half of a CRLF.
                    None => {
                        self.scanned = line_end;
                        return last_event_end;
                    }
                    Some(b'\n') => 2,
                    Some(_) => 1,
                },
                _ => 1,
            };
            let next = line_end + terminator_len;
            if line_end == self.line_start {
                last_event_end = next;
            }
            self.line_start = next;
            position = next;
        }
        self.scanned = buffer.len();
        last_event_end
    }

    /// Shifts the scan state after the first `consumed` bytes were emitted.
    fn rebase(&mut self, consumed: usize) {
        self.scanned -= consumed;
        self.line_start -= consumed;
    }
}

/// The lines of `text` as (content range, range including the terminator).
/// `text` holds only complete lines, so a trailing CR is a whole terminator.
fn lines(text: &[u8]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut position = 0;
    std::iter::from_fn(move || {
        if position >= text.len() {
            return None;
        }
        let start = position;
        let end =
            memchr::memchr2(b'\r', b'\n', &text[start..]).map_or(text.len(), |found| start + found);
        position = match (text.get(end), text.get(end + 1)) {
            (Some(b'\r'), Some(b'\n')) => end + 2,
            (Some(_), _) => end + 1,
            (None, _) => end,
        };
        Some(start..end)
    })
}

/// Makes a restored id fit in a `data:` line. Only a non-scalar id (not valid
/// in MCP, but tracked) can hold line breaks, as JSON whitespace: an LF
/// continues the data on a new `data:` line, which gives back exactly the
/// same data once the client joins the lines; a CR, which the client would
/// read as a line end too, becomes a space, the same JSON.
fn fit_data_line(restored: Vec<u8>) -> Vec<u8> {
    if memchr::memchr2(b'\r', b'\n', &restored).is_none() {
        return restored;
    }
    let mut fitted = Vec::with_capacity(restored.len() + 16);
    for byte in restored {
        match byte {
            b'\n' => fitted.extend_from_slice(b"\ndata: "),
            b'\r' => fitted.push(b' '),
            _ => fitted.push(byte),
        }
    }
    fitted
}

/// Splits a run of complete events into one range per event.
fn event_ranges(events: &[u8]) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut start = 0;
    let mut line_ends = lines(events).peekable();
    while let Some(line) = line_ends.next() {
        if line.is_empty() {
            let end = line_ends.peek().map_or(events.len(), |next| next.start);
            ranges.push(start..end);
            start = end;
        }
    }
    ranges
}

/// The responses carried in one event's data, with the edits (in event
/// coordinates) that restore their ids.
fn inspect_event(event: &[u8]) -> Responses {
    let mut data_values: Vec<Range<usize>> = Vec::new();
    for line in lines(event) {
        let content = &event[line.clone()];
        let (field, value_start) = match memchr::memchr(b':', content) {
            Some(0) => continue, // a comment
            Some(colon) => {
                let after = colon + 1;
                let skip_space = usize::from(content.get(after) == Some(&b' '));
                (&content[..colon], line.start + after + skip_space)
            }
            None => (content, line.end),
        };
        match field {
            b"data" => data_values.push(value_start..line.end),
            // Only the default event type carries JSON-RPC messages.
            b"event" if &event[value_start..line.end] != b"message" => return Responses::default(),
            _ => {}
        }
    }
    match data_values.as_slice() {
        [] => Responses::default(),
        [only] => {
            let mut found = inspect_responses(&event[only.clone()]);
            for (range, _) in &mut found.edits {
                *range = range.start + only.start..range.end + only.start;
            }
            found
        }
        several => inspect_multi_line(event, several),
    }
}

/// Data split over several `data:` lines is one message joined by LF; map the
/// edits in the joined text back to the lines they came from.
fn inspect_multi_line(event: &[u8], values: &[Range<usize>]) -> Responses {
    let mut joined = Vec::new();
    let mut segment_starts = Vec::with_capacity(values.len());
    for (index, value) in values.iter().enumerate() {
        if index > 0 {
            joined.push(b'\n');
        }
        segment_starts.push(joined.len());
        joined.extend_from_slice(&event[value.clone()]);
    }
    let found = inspect_responses(&joined);
    let edits = found
        .edits
        .into_iter()
        .filter_map(|(range, new)| {
            let segment = segment_starts.partition_point(|&start| start <= range.start) - 1;
            let segment_start = segment_starts[segment];
            let value = &values[segment];
            // A JSON token never spans a line break, so it lies in one segment.
            (range.end - segment_start <= value.len()).then(|| {
                let start = value.start + range.start - segment_start;
                (start..start + range.len(), new)
            })
        })
        .collect();
    Responses {
        edits,
        answered: found.answered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{id_key, IdMinter};

    fn rewrite_in_chunks(input: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut rewriter = SseRewriter::default();
        let mut out = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            if let Some(bytes) = rewriter.push(Bytes::copy_from_slice(&input[start..cut])) {
                out.extend_from_slice(&bytes);
            }
            start = cut;
        }
        if let Some(bytes) = rewriter.finish() {
            out.extend_from_slice(&bytes);
        }
        out
    }

    #[test]
    fn restores_response_and_keeps_everything_else() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint("1")).unwrap();
        let input = format!(
            ": keep-alive\r\n\r\nid: 0\nretry: 3000\ndata:\n\n\
             data: {{\"method\":\"notifications/progress\",\"params\":{{\"id\":{server_id}}}}}\n\n\
             id: 1\rdata: {{\"jsonrpc\":\"2.0\",\r\
             data: \"id\":{server_id},\"result\":{{}}}}\r\r"
        );
        let expected = ": keep-alive\r\n\r\nid: 0\nretry: 3000\ndata:\n\n"
            .to_string()
            + &format!("data: {{\"method\":\"notifications/progress\",\"params\":{{\"id\":{server_id}}}}}\n\n")
            + "id: 1\rdata: {\"jsonrpc\":\"2.0\",\rdata: \"id\":1,\"result\":{}}\r\r";
        let whole = rewrite_in_chunks(input.as_bytes(), &[]);
        assert_eq!(String::from_utf8(whole).unwrap(), expected);
        for cut in 0..=input.len() {
            assert_eq!(
                String::from_utf8(rewrite_in_chunks(input.as_bytes(), &[cut])).unwrap(),
                expected,
                "split at {cut}"
            );
        }
    }

    #[test]
    fn any_two_cuts_give_the_unsplit_output() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint(r#""a""#)).unwrap();
        let input =
            format!(":\r\ndata: {{\"id\":{server_id},\r\ndata: \"result\":1}}\r\n\r\ndata: 2\r\r");
        let expected = ":\r\ndata: {\"id\":\"a\",\r\ndata: \"result\":1}\r\n\r\ndata: 2\r\r";
        for first in 0..=input.len() {
            for second in first..=input.len() {
                let out = rewrite_in_chunks(input.as_bytes(), &[first, second]);
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    expected,
                    "cuts {first},{second}"
                );
            }
        }
    }

    #[test]
    fn streams_without_the_prefix_come_back_as_the_same_bytes() {
        let input = b"retry: 10\n\nid: 7\ndata: {\"id\":1,\"result\":{}}\n\n: ping\n\n";
        let mut rewriter = SseRewriter::default();
        let out = rewriter.push(Bytes::from_static(input)).unwrap();
        assert_eq!(
            out.as_ptr(),
            input.as_ptr(),
            "whole events are passed on without copying"
        );
        assert_eq!(rewriter.finish(), None);
    }

    #[test]
    fn notices_when_the_awaited_responses_have_passed() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint(r#""\u0031""#)).unwrap();
        let mut rewriter = SseRewriter::awaiting(vec![id_key("1"), id_key("2")]);
        let first = format!("data: {{\"method\":\"n\",\"params\":{{\"result\":1}}}}\n\ndata: {{\"id\":{server_id},\"result\":1}}\n\n");
        rewriter.push(Bytes::from(first));
        assert!(
            !rewriter.all_answered(),
            "only the response with id 1 passed"
        );
        rewriter.push(Bytes::from_static(b"data: {\"id\":\"2\",\"error\":{}}\n"));
        assert!(!rewriter.all_answered(), "the event is not complete yet");
        rewriter.push(Bytes::from_static(b"\n"));
        assert!(rewriter.all_answered());
    }

    #[test]
    fn a_restored_id_with_line_breaks_stays_one_valid_event() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint("[1,\r\n2]")).unwrap();
        let input = format!("data: {{\"id\":{server_id},\"result\":{{}}}}\n\n");
        let out = String::from_utf8(rewrite_in_chunks(input.as_bytes(), &[])).unwrap();
        assert_eq!(out, "data: {\"id\":[1, \ndata: 2],\"result\":{}}\n\n");
    }

    #[test]
    fn other_event_types_are_untouched() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint("1")).unwrap();
        let input = format!("event: custom\ndata: {{\"id\":{server_id},\"result\":1}}\n\n");
        assert_eq!(rewrite_in_chunks(input.as_bytes(), &[]), input.as_bytes());
    }

    #[test]
    fn unterminated_event_is_flushed_unchanged() {
        let input = b"data: {\"id\":1,\"result\":1}\r";
        assert_eq!(rewrite_in_chunks(input, &[5]), input);
    }
}
