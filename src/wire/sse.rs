//! The one incremental SSE rewriter: restores client ids in JSON-RPC responses
//! carried by `text/event-stream` bodies, as a stream, however it is chunked.
//!
//! It frames lines (ending in CR, LF or CRLF; a CR at the end of one chunk may
//! pair with an LF at the start of the next) and hands the text of each
//! event's `data:` lines, joined by line breaks as a client joins them, to
//! the [`Restorer`]. Bytes are passed on as they arrive: only an id waiting
//! for its message to show whether it is a response is held back, never a
//! whole line or event. Comments (keep-alives), `id:`/`event:`/`retry:`
//! lines and priming events pass byte for byte. A byte order mark at the
//! start of the stream is ignored, as the SSE standard's decoder does, and
//! passes on too.
//!
//! It also follows the stream's last event id as a client does (the value of
//! the last `id` field without NUL, taken when an event is dispatched, a
//! priming event included): a client resuming the stream sends it as
//! `Last-Event-ID`, which tells the guard which stream a resumed `GET` is.
//!
//! Every event's data is read, whatever its type. Clients read JSON-RPC
//! messages only from events of type `message` (the type of an event with no
//! `event:` field, or an empty one), and by the SSE standard the type is the
//! value of the event's *last* `event:` line, which may come after its data
//! lines: `event: other`, data, `event: message` dispatches as a `message`.
//! As bytes go on as they arrive, the type is not known while the data
//! passes, so no event is skipped: a response restored in an event the client
//! ignores is harmless, one left with the server's id in an event it reads
//! leaves the client waiting.

use std::collections::VecDeque;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::wire::restore::Delivered;
use crate::wire::restore::{Binding, Part, Restorer};

/// The longest field name the framer keeps to recognise it; longer ones are
/// not `data`.
const SHORT: usize = 4;

/// A UTF-8 byte order mark: the SSE decoder drops one at the start of the
/// stream, so it is no part of the first field's name.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The longest event id followed. A longer one is known only as "too long":
/// a stream resumed from it is tied to no request (fail closed).
pub(crate) const MAX_EVENT_ID: usize = 256;

/// The pieces of one chunk as the framer finds them: a few per event, kept
/// inline.
type Parts = SmallVec<[Part; 4]>;

/// The longest event id followed without an allocation.
const SHORT_EVENT_ID: usize = 16;

/// Where the framer is in the current line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the start of a line.
    Start,
    /// Reading the field name.
    Name,
    /// Just after `data:`: one leading space is not part of the value.
    DataStart,
    /// In a `data:` value.
    Data,
    /// Just after `id:`: one leading space is not part of the value.
    IdStart,
    /// In an `id:` value.
    Id,
    /// In a line whose rest does not matter (a comment, another field).
    Skip,
}

/// Incremental SSE rewriter state.
#[derive(Debug)]
pub(crate) struct Rewriter {
    restorer: Restorer,
    line: Line,
    /// The field name read so far (first [`SHORT`] + 1 bytes, after a byte
    /// order mark): inline, as the rest of the framer's state that every
    /// response stream starts with, so that framing allocates nothing.
    short: SmallVec<[u8; SHORT + 1 + BOM.len()]>,
    /// The last chunk ended in a CR: an LF first in the next one is part of
    /// that line end.
    after_cr: bool,
    /// Absolute offset of the next chunk.
    offset: usize,
    /// The current event's data lines so far.
    data_lines: usize,
    /// Absolute offset where the last data line's value ended.
    data_end: usize,
    /// The pieces of the chunk being framed (a few per event).
    parts: Parts,
    /// No line has ended yet: a byte order mark may lead the first name.
    first_line: bool,
    /// The `id` field being read.
    id_field: EventId,
    /// The last event id buffer (set by each `id` field without NUL).
    id_buffer: EventId,
    /// The last event id of the stream, as of the last dispatched event.
    last_id: EventId,
    /// How many times dispatching changed `last_id`.
    id_changes: u64,
}

/// An event id as followed: its bytes up to [`MAX_EVENT_ID`], or too long.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct EventId {
    /// Inline up to [`SHORT_EVENT_ID`] bytes (rmcp's are `<n>/<m>`).
    bytes: SmallVec<[u8; SHORT_EVENT_ID]>,
    too_long: bool,
    /// The value holds a NUL (seen even past the length kept): the SSE
    /// standard ignores such a field.
    nul: bool,
}

impl EventId {
    fn clear(&mut self) {
        self.bytes.clear();
        self.too_long = false;
        self.nul = false;
    }

    fn extend(&mut self, bytes: &[u8]) {
        self.nul |= memchr::memchr(0, bytes).is_some();
        if self.too_long || self.bytes.len() + bytes.len() > MAX_EVENT_ID {
            self.too_long = true;
            self.bytes.clear();
        } else {
            self.bytes.extend_from_slice(bytes);
        }
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new(usize::MAX, false)
    }
}

impl Rewriter {
    /// A rewriter that holds ids up to `max_id` bytes; `watch`: also learn
    /// every response that passes ([`take_answered`](Self::take_answered)).
    pub(crate) fn new(max_id: usize, watch: bool) -> Self {
        Self {
            restorer: Restorer::new(max_id, watch),
            line: Line::Start,
            short: SmallVec::new(),
            after_cr: false,
            offset: 0,
            data_lines: 0,
            data_end: 0,
            parts: Parts::new(),
            first_line: true,
            id_field: EventId::default(),
            id_buffer: EventId::default(),
            last_id: EventId::default(),
            id_changes: 0,
        }
    }

    /// The stream's last event id as a client holds it now: `None` when
    /// there is none (or it is empty: a client then sends no
    /// `Last-Event-ID`) or it was longer than [`MAX_EVENT_ID`].
    pub(crate) fn last_event_id(&self) -> Option<&[u8]> {
        (!self.last_id.too_long && !self.last_id.bytes.is_empty())
            .then_some(self.last_id.bytes.as_slice())
    }

    /// Changes whenever [`last_event_id`](Self::last_event_id) does: tells a
    /// reader when it is worth reading again.
    pub(crate) fn event_id_changes(&self) -> u64 {
        self.id_changes
    }

    /// A rewriter that only watches: it restores nothing.
    pub(crate) fn without_restoring(mut self) -> Self {
        self.restorer = self.restorer.without_restoring();
        self
    }

    /// A rewriter that restores only the ids `binding` issued.
    pub(crate) fn bound(mut self, binding: Binding) -> Self {
        self.restorer = self.restorer.bound(binding);
        self
    }

    /// How many server-side-looking ids were refused since the last call.
    pub(crate) fn take_refused(&mut self) -> usize {
        self.restorer.take_refused()
    }

    /// See [`Restorer::answering_up_to`].
    pub(crate) fn answering_up_to(mut self, requests: usize) -> Self {
        self.restorer = self.restorer.answering_up_to(requests);
        self
    }

    /// The responses whose events passed whole since the last call (only
    /// when watching).
    pub(crate) fn take_answered(&mut self) -> smallvec::Drain<'_, [Delivered; 1]> {
        self.restorer.take_answered()
    }

    /// How many ids were restored since the last call.
    pub(crate) fn take_restored(&mut self) -> usize {
        self.restorer.take_restored()
    }

    /// Feeds one chunk; appends what can go on to `out`.
    pub(crate) fn push(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) {
        if chunk.is_empty() {
            return;
        }
        let base = self.offset;
        let mut parts = std::mem::take(&mut self.parts);
        parts.clear();
        let mut at = 0;
        if self.after_cr && chunk.first() == Some(&b'\n') {
            at = 1;
        }
        self.after_cr = false;
        while at < chunk.len() {
            at = self.step(&chunk, at, base, &mut parts);
        }
        self.offset = base + chunk.len();
        self.restorer.push(&chunk, base, &parts, out);
        self.parts = parts;
    }

    /// Ends the stream: a final CR ends its line, an unterminated last event
    /// ends with the stream (and is restored like any other), and whatever is
    /// held goes on.
    pub(crate) fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        let mut parts = Parts::new();
        if self.data_lines > 0 {
            parts.push(Part::End(self.data_end));
        }
        self.restorer.push(&Bytes::new(), self.offset, &parts, out);
        self.restorer.finish(out);
    }

    /// Reads from `chunk[at]` to the end of the current line's state;
    /// returns where to go on.
    fn step(&mut self, chunk: &[u8], at: usize, base: usize, parts: &mut Parts) -> usize {
        let rest = &chunk[at..];
        // The end of this line in the chunk, if it is in it.
        let line_end = memchr::memchr2(b'\r', b'\n', rest).map(|found| at + found);
        match self.line {
            Line::Start if line_end == Some(at) => {
                self.end_event(base + at, parts);
                return self.end_line(chunk, at);
            }
            Line::Start => {
                self.short.clear();
                self.line = if chunk[at] == b':' {
                    Line::Skip
                } else {
                    Line::Name
                };
                return at;
            }
            Line::Name => {
                let stop = memchr::memchr3(b':', b'\r', b'\n', rest)
                    .map_or(chunk.len(), |found| at + found);
                self.keep_short(&chunk[at..stop]);
                let Some(&byte) = chunk.get(stop) else {
                    return stop;
                };
                let mut field = self.short.as_slice();
                if self.first_line {
                    field = field.strip_prefix(BOM).unwrap_or(field);
                }
                // The `event:` field is not told apart: see the module docs.
                let (with_value, empty) = match field {
                    b"data" => (Line::DataStart, Line::Data),
                    b"id" => (Line::IdStart, Line::Id),
                    _ => (Line::Skip, Line::Skip),
                };
                if with_value == Line::IdStart {
                    self.id_field.clear();
                }
                if byte == b':' {
                    self.short.clear();
                    self.line = with_value;
                    return stop + 1;
                }
                // A field name alone: its value is empty.
                self.short.clear();
                self.line = empty;
                if empty == Line::Data {
                    self.data_line(base + stop, parts);
                }
                return stop;
            }
            Line::DataStart => {
                let start = at + usize::from(chunk[at] == b' ');
                self.data_line(base + start, parts);
                self.line = Line::Data;
                return start;
            }
            Line::IdStart => {
                self.line = Line::Id;
                return at + usize::from(chunk[at] == b' ');
            }
            Line::Data | Line::Id | Line::Skip => {}
        }
        let end = line_end.unwrap_or(chunk.len());
        match self.line {
            Line::Data => {
                if end > at {
                    parts.push(Part::Json(base + at..base + end));
                }
                self.data_end = base + end;
            }
            Line::Id => self.id_field.extend(&chunk[at..end]),
            _ => {}
        }
        match line_end {
            Some(end) => self.end_line(chunk, end),
            None => chunk.len(),
        }
    }

    /// A `data:` line's value starts at absolute `position`.
    fn data_line(&mut self, position: usize, parts: &mut Parts) {
        if self.data_lines > 0 {
            parts.push(Part::Break(self.data_end));
        }
        self.data_lines += 1;
        self.data_end = position;
    }

    /// Consumes the line end at `chunk[at]`; returns where the next line
    /// starts.
    fn end_line(&mut self, chunk: &[u8], at: usize) -> usize {
        // An `id` field sets the buffer unless its value holds a NUL (the
        // SSE standard ignores such a field).
        if matches!(self.line, Line::Id | Line::IdStart) && !self.id_field.nul {
            std::mem::swap(&mut self.id_buffer, &mut self.id_field);
        }
        self.first_line = false;
        self.line = Line::Start;
        if chunk[at] == b'\r' {
            match chunk.get(at + 1) {
                Some(b'\n') => return at + 2,
                None => self.after_cr = true,
                Some(_) => {}
            }
        }
        at + 1
    }

    /// A blank line ends the event (at absolute `position`).
    fn end_event(&mut self, position: usize, parts: &mut Parts) {
        if self.data_lines > 0 {
            parts.push(Part::End(self.data_end.min(position)));
        }
        self.data_lines = 0;
        // Dispatching sets the stream's last event id, even for an event
        // without data (a priming event).
        if (&self.last_id.bytes, self.last_id.too_long)
            != (&self.id_buffer.bytes, self.id_buffer.too_long)
        {
            self.last_id.clone_from(&self.id_buffer);
            self.id_changes += 1;
        }
    }

    fn keep_short(&mut self, bytes: &[u8]) {
        let room = (SHORT + 1 + BOM.len()).saturating_sub(self.short.len());
        self.short
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::id::{id_key, IdMinter};

    fn rewrite_in_chunks(input: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut rewriter = Rewriter::default();
        let mut out = VecDeque::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            rewriter.push(Bytes::copy_from_slice(&input[start..cut]), &mut out);
            start = cut;
        }
        rewriter.finish(&mut out);
        out.iter().flat_map(|piece| piece.iter().copied()).collect()
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
        let mut rewriter = Rewriter::default();
        let mut out = VecDeque::new();
        rewriter.push(Bytes::from_static(input), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0].as_ptr(),
            input.as_ptr(),
            "the chunk is passed on without copying"
        );
        rewriter.finish(&mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn learns_each_response_once_its_event_ends() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint(r#""\u0031""#)).unwrap();
        let mut rewriter = Rewriter::new(usize::MAX, true);
        let mut out = VecDeque::new();
        let first = format!("data: {{\"method\":\"n\",\"params\":{{\"result\":1}}}}\n\ndata: {{\"id\":{server_id},\"result\":1}}\n\n");
        rewriter.push(Bytes::from(first), &mut out);
        assert_eq!(
            rewriter.take_answered().collect::<Vec<_>>(),
            [(id_key("1"), true)],
            "only the response with id 1 passed, restored"
        );
        rewriter.push(
            Bytes::from_static(b"data: {\"id\":\"2\",\"error\":{}}\n"),
            &mut out,
        );
        assert_eq!(
            rewriter.take_answered().count(),
            0,
            "the event is not complete yet"
        );
        rewriter.push(Bytes::from_static(b"\n"), &mut out);
        assert_eq!(
            rewriter.take_answered().collect::<Vec<_>>(),
            [(id_key("2"), false)]
        );
    }

    #[test]
    fn an_id_that_would_break_its_data_line_is_not_restored() {
        // Guards mint only string and number ids, which hold no raw line
        // break; a server that forges one gets its bytes passed on as they are.
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint("[1,\r\n2]")).unwrap();
        let input = format!("data: {{\"id\":{server_id},\"result\":{{}}}}\n\n");
        let out = rewrite_in_chunks(input.as_bytes(), &[]);
        assert_eq!(out, input.as_bytes());
    }

    #[test]
    fn an_unterminated_last_event_is_restored() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint("1")).unwrap();
        let input = format!("data: {{\"id\":{server_id},\"result\":{{}}}}");
        for cut in 0..=input.len() {
            let out = rewrite_in_chunks(input.as_bytes(), &[cut]);
            assert_eq!(out, b"data: {\"id\":1,\"result\":{}}", "cut {cut}");
        }
    }

    #[test]
    fn a_huge_event_goes_on_as_it_arrives() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint("1")).unwrap();
        let mut rewriter = Rewriter::default();
        let mut out = VecDeque::new();
        rewriter.push(
            Bytes::from(format!(
                "data: {{\"id\":{server_id},\"result\":{{\"text\":\""
            )),
            &mut out,
        );
        // The response is held until its end or the window after its id (a
        // second `id` key in it would leave it as the server wrote it).
        let head: Vec<u8> = out.drain(..).flat_map(|piece| piece.to_vec()).collect();
        assert_eq!(head, b"data: {\"id\":");
        let chunk = Bytes::from(vec![b'x'; 1 << 20]);
        rewriter.push(chunk.clone(), &mut out);
        let tail = out.back().unwrap();
        let tail_offset = tail.as_ptr() as usize - chunk.as_ptr() as usize;
        assert!(
            tail_offset < 70_000 && tail_offset + tail.len() == chunk.len(),
            "the chunk past the window goes on uncopied"
        );
        let first: Vec<u8> = out.drain(..).flat_map(|piece| piece.to_vec()).collect();
        assert_eq!(first.len(), br#"1,"result":{"text":""#.len() + chunk.len());
        assert!(first.starts_with(br#"1,"result":{"text":"x"#), "restored");
        for _ in 0..16 {
            rewriter.push(chunk.clone(), &mut out);
            assert_eq!(out.len(), 1, "each chunk goes on at once");
            assert_eq!(
                out.pop_front().unwrap().as_ptr(),
                chunk.as_ptr(),
                "uncopied"
            );
        }
    }

    #[test]
    fn events_of_every_type_are_restored() {
        // A client reads the first three and the fifth as `message` events:
        // an empty type is `message`, and the last `event:` line counts, even
        // after the data. It ignores the others, where restoring is harmless;
        // the framer cannot know the type before the data passes.
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint("1")).unwrap();
        for head in [
            "event:\n",
            "event\n",
            "event: \r\n",
            "event: custom\n",
            "event: custom\nevent:\n",
            "event: message\nevent: other\n",
        ] {
            for tail in ["", "event: message\n", "event\r", "event: custom\n"] {
                let input =
                    format!("{head}data: {{\"id\":{server_id},\ndata: \"result\":1}}\n{tail}\n");
                let expected = format!("{head}data: {{\"id\":1,\ndata: \"result\":1}}\n{tail}\n");
                for cut in 0..=input.len() {
                    let out = rewrite_in_chunks(input.as_bytes(), &[cut]);
                    assert_eq!(
                        String::from_utf8(out).unwrap(),
                        expected,
                        "cut {cut} of {input:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_byte_order_mark_before_the_first_field_is_ignored() {
        let minter = IdMinter::new();
        let server_id = String::from_utf8(minter.mint("1")).unwrap();
        for head in ["", "id: 0\n", ": hi\n"] {
            let input = format!("\u{feff}{head}data: {{\"id\":{server_id},\"result\":{{}}}}\n\n");
            let expected = format!("\u{feff}{head}data: {{\"id\":1,\"result\":{{}}}}\n\n");
            for cut in 0..=input.len() {
                let mut rewriter = Rewriter::new(usize::MAX, true);
                let mut out = VecDeque::new();
                rewriter.push(Bytes::copy_from_slice(&input.as_bytes()[..cut]), &mut out);
                rewriter.push(Bytes::copy_from_slice(&input.as_bytes()[cut..]), &mut out);
                let answered: Vec<_> = rewriter.take_answered().collect();
                rewriter.finish(&mut out);
                let out: Vec<u8> = out.iter().flat_map(|piece| piece.to_vec()).collect();
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    expected,
                    "cut {cut} {head:?}"
                );
                assert_eq!(answered, [(id_key("1"), true)], "cut {cut} {head:?}");
            }
        }
        // Only at the start of the stream: later, it is part of a name.
        let input = format!("data: 1\n\n\u{feff}data: {{\"id\":{server_id},\"result\":{{}}}}\n\n");
        assert_eq!(rewrite_in_chunks(input.as_bytes(), &[]), input.as_bytes());
    }

    /// What a client would send as `Last-Event-ID` after reading `input`.
    fn last_event_id(input: &str, cut: usize) -> Option<Vec<u8>> {
        let mut rewriter = Rewriter::default();
        let mut out = VecDeque::new();
        rewriter.push(Bytes::copy_from_slice(&input.as_bytes()[..cut]), &mut out);
        rewriter.push(Bytes::copy_from_slice(&input.as_bytes()[cut..]), &mut out);
        rewriter.last_event_id().map(<[u8]>::to_vec)
    }

    #[test]
    fn follows_the_last_event_id_as_a_client_does() {
        let cases: &[(&str, Option<&str>)] = &[
            ("", None),
            // A priming event sets it; an event not yet dispatched does not.
            ("id: 0\ndata:\n\n", Some("0")),
            ("id: 0\ndata:\n\nid: 1\ndata: x\n", Some("0")),
            ("id: 0\n\nid: 1\ndata: x\n\n", Some("1")),
            // The buffer outlives its event.
            ("id: 5\n\ndata: x\n\n", Some("5")),
            // One leading space is dropped, others kept; CR and CRLF end lines.
            ("id:  a b\r\n\r\n", Some(" a b")),
            ("id:a\r\rid\r\r", None),
            // A NUL voids the field, not the buffer.
            ("id: 1\n\nid: 2\u{0}\n\n", Some("1")),
            // A byte order mark leads only the first name.
            ("\u{feff}id: 9\n\n", Some("9")),
            ("\u{feff}: c\nid: 9\n\n", Some("9")),
            // Not `id`.
            ("idx: 1\n\nID: 2\n\n", None),
        ];
        for (input, expected) in cases {
            for cut in 0..=input.len() {
                assert_eq!(
                    last_event_id(input, cut),
                    expected.map(|id| id.as_bytes().to_vec()),
                    "{input:?} cut {cut}"
                );
            }
        }
        let long = format!("id: {}\n\n", "7".repeat(MAX_EVENT_ID + 1));
        assert_eq!(last_event_id(&long, 3), None, "too long to follow");
        // A NUL past the length kept still voids the field.
        let nul = format!("id: 5\n\nid: {}\0\n\n", "7".repeat(MAX_EVENT_ID + 1));
        for cut in [3, 12, nul.len() - 3] {
            assert_eq!(last_event_id(&nul, cut), Some(b"5".to_vec()), "cut {cut}");
        }
        let fits = format!("id: {}\n\n", "7".repeat(MAX_EVENT_ID));
        assert_eq!(
            last_event_id(&fits, 9).map(|id| id.len()),
            Some(MAX_EVENT_ID)
        );
    }

    #[test]
    fn unterminated_event_is_flushed_unchanged() {
        let input = b"data: {\"id\":1,\"result\":1}\r";
        assert_eq!(rewrite_in_chunks(input, &[5]), input);
    }
}
