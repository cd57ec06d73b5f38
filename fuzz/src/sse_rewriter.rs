//! Fuzz target (b): the incremental SSE rewriter of `text/event-stream`
//! responses, fed arbitrary bytes in arbitrary chunkings.
//!
//! Invariants checked for every input:
//! - no panic;
//! - chunking never changes the output: the fuzz-chosen chunking (and, for
//!   short streams, one byte at a time) gives the bytes of the unsplit rewrite;
//! - the output differs from the input only where the top-level `id` of a
//!   JSON-RPC response in an event of any type is a server-side id: there it
//!   is replaced by the original id text, byte for byte (checked against an
//!   independent whole-stream reading of the SSE and JSON-RPC rules in
//!   [`super::oracle`]); a stream without the reserved prefix comes back
//!   byte-identical; every event keeps its lines, and every event whose data
//!   was JSON still carries valid JSON;
//! - for streams generated structurally (the first input byte is odd), with
//!   ids minted by [`Minter`], the output is exactly the expected output
//!   built alongside the input.

use bytes::Bytes;
use mcp_id_guard::internals::{Minter, SseRewriter};

use super::input::{id_text, split_at_cuts, Input, ID_POOL};
use super::oracle::{self, Kind, PREFIX};
use super::KnownBug;

/// Runs the target's checks on one input. Panics on a violation; returns
/// the known bug an input shows, if any.
pub fn check(data: &[u8]) -> Result<(), KnownBug> {
    let mut input = Input::new(data);
    if input.flag() {
        let generated = generate(&mut input);
        let cuts = input.cuts(generated.stream.len(), 8);
        check_stream(&generated.stream, &cuts, Some(&generated))
    } else {
        let cut_input = input.bytes(16).to_vec();
        let stream = input.rest();
        let cuts = Input::new(&cut_input).cuts(stream.len(), 8);
        check_stream(stream, &cuts, None)
    }
}

/// The rewriter's output for `stream` fed in `pieces`.
pub fn rewrite(pieces: &[&[u8]]) -> Vec<u8> {
    let mut rewriter = SseRewriter::default();
    let mut out = Vec::new();
    for piece in pieces {
        if let Some(bytes) = rewriter.push(Bytes::copy_from_slice(piece)) {
            out.extend_from_slice(&bytes);
        }
    }
    if let Some(bytes) = rewriter.finish() {
        out.extend_from_slice(&bytes);
    }
    out
}

fn check_stream(
    stream: &[u8],
    cuts: &[usize],
    generated: Option<&Generated>,
) -> Result<(), KnownBug> {
    let unsplit = rewrite(&[stream]);
    let escaped = generated.is_some_and(|g| g.escaped_prefix) || has_escaped_prefix_id(stream);
    let mut chunkings = vec![split_at_cuts(stream, cuts)];
    if stream.len() <= 256 {
        chunkings.push(stream.chunks(1).collect());
    }
    for pieces in &chunkings {
        let out = rewrite(pieces);
        if out != unsplit {
            if escaped {
                return Err(KnownBug::EscapedPrefixDependsOnChunking);
            }
            panic!(
                "chunking changed the output\n  input: {:?}\n  cuts: {:?}\n  unsplit: {:?}\n  chunked: {:?}",
                String::from_utf8_lossy(stream),
                pieces.iter().map(|p| p.len()).collect::<Vec<_>>(),
                String::from_utf8_lossy(&unsplit),
                String::from_utf8_lossy(&out),
            );
        }
    }
    if memchr_prefix(stream).is_none() {
        assert_eq!(
            unsplit, stream,
            "a stream without the reserved prefix must come back byte-identical"
        );
    }
    check_against_oracle(stream, &unsplit, escaped)?;
    if let Some(generated) = generated {
        if unsplit != generated.expected {
            if escaped {
                return Err(KnownBug::EscapedPrefixDependsOnChunking);
            }
            panic!(
                "output differs from the expected rewrite\n  input:    {:?}\n  expected: {:?}\n  output:   {:?}",
                String::from_utf8_lossy(stream),
                String::from_utf8_lossy(&generated.expected),
                String::from_utf8_lossy(&unsplit),
            );
        }
    }
    Ok(())
}

fn memchr_prefix(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(PREFIX.len())
        .position(|window| window == PREFIX.as_bytes())
}

/// Whether some top-level response id of some event is a server-side id
/// whose prefix is not written literally (restored by crates that decode
/// before they compare, and then not however the stream is chunked).
fn has_escaped_prefix_id(stream: &[u8]) -> bool {
    let (events, _) = oracle::sse_events(without_bom(stream));
    events.iter().any(|event| {
        response_ids(event).iter().any(|token| {
            oracle::restore(token).is_none() && oracle::restore_decoded(token).is_some()
        })
    })
}

/// A UTF-8 byte order mark: the SSE standard's decoder drops one at the
/// start of a stream, so it belongs to no field name.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The stream as the SSE decoder parses it: without a leading byte order
/// mark.
fn without_bom(stream: &[u8]) -> &[u8] {
    stream.strip_prefix(BOM).unwrap_or(stream)
}

/// The top-level response id tokens of one event, whatever its type (a
/// client reads only `message` events, but the type may be set by an
/// `event:` line after the data, which has passed by then).
fn response_ids(event: &[u8]) -> Vec<String> {
    let parsed = oracle::sse_event(event);
    let Some(data) = parsed.data else {
        return Vec::new();
    };
    let Some(body) = oracle::read(&data, oracle::Writer::Server) else {
        return Vec::new();
    };
    body.messages()
        .iter()
        .filter(|message| message.kind == Kind::Response)
        .filter_map(|message| {
            let token = std::str::from_utf8(&data[message.id.clone()?]).ok()?;
            Some(token.to_owned())
        })
        .collect()
}

/// The top-level response ids of one event that the documented rule
/// restores: (server-side id token, original text), in order.
fn restorations(event: &[u8]) -> Vec<(String, String)> {
    response_ids(event)
        .into_iter()
        .filter_map(|token| {
            let original = oracle::restore(&token)?;
            Some((token, original))
        })
        .collect()
}

/// The output against the whole-stream oracle: same events, same tail,
/// events changed only by restoring their top-level response ids. A
/// restored id holding line breaks (JSON whitespace of a non-scalar id) must
/// still fit the event: an LF continues the data on a new `data:` line, a CR
/// becomes a space (the same JSON once the client joins the lines); a crate
/// that splices it raw shows [`KnownBug::LineBreakInRestoredSseId`].
///
/// Two places no client reads, where the rewriter may restore or leave the
/// bytes as they are: the unterminated tail (a client discards it at the end
/// of the stream; the rewriter restores it as a complete event, for clients
/// that read one anyway), and a response followed in its data by bytes that
/// are not JSON whitespace (no JSON parser reads such data; the rewriter
/// decides at the message's closing brace, before the rest arrives).
fn check_against_oracle(stream: &[u8], out: &[u8], escaped: bool) -> Result<(), KnownBug> {
    assert_eq!(
        stream.starts_with(BOM),
        out.starts_with(BOM),
        "a byte order mark leading the stream passes on"
    );
    let (stream, out) = (without_bom(stream), without_bom(out));
    let (events_in, tail_in) = oracle::sse_events(stream);
    let (events_out, tail_out) = oracle::sse_events(out);
    let line_breaks = events_in.iter().any(|event| {
        restorations(event)
            .iter()
            .any(|(_, original)| original.contains(['\r', '\n']))
    });
    if events_in.len() != events_out.len() && line_breaks {
        return Err(KnownBug::LineBreakInRestoredSseId);
    }
    assert_eq!(
        events_in.len(),
        events_out.len(),
        "the rewrite changed the number of events\n  input:  {:?}\n  output: {:?}",
        String::from_utf8_lossy(stream),
        String::from_utf8_lossy(out),
    );
    for (event_in, event_out) in events_in.iter().zip(&events_out) {
        check_event(event_in, event_out, escaped)?;
    }
    if tail_in != tail_out {
        check_event(tail_in, tail_out, escaped)?;
    }
    Ok(())
}

/// One event (or the unterminated tail) against the oracle: byte-identical
/// when nothing in it is to be restored, else changed exactly at its
/// top-level response ids.
fn check_event(event_in: &[u8], event_out: &[u8], escaped: bool) -> Result<(), KnownBug> {
    let restored = restorations(event_in);
    if restored.is_empty() {
        if escaped && event_in != event_out {
            return Err(KnownBug::EscapedPrefixDependsOnChunking);
        }
        if event_in != event_out && unreadable_restored(event_in, event_out) {
            return Ok(());
        }
        assert_eq!(
            String::from_utf8_lossy(event_in),
            String::from_utf8_lossy(event_out),
            "an event with nothing to restore must pass byte-identical"
        );
        return Ok(());
    }
    let known = restored
        .iter()
        .any(|(_, original)| original.contains(['\r', '\n']));
    let parsed_in = oracle::sse_event(event_in);
    let parsed_out = oracle::sse_event(event_out);
    let data_in = parsed_in.data.expect("restorations come from data");
    let expected = restored_data(&data_in);
    let fits = parsed_out.other_lines == parsed_in.other_lines
        && parsed_out.data.as_deref() == Some(&expected[..]);
    if !fits && known {
        return Err(KnownBug::LineBreakInRestoredSseId);
    }
    if !fits && escaped {
        return Err(KnownBug::EscapedPrefixDependsOnChunking);
    }
    assert_eq!(
        parsed_in.other_lines,
        parsed_out.other_lines,
        "only data lines may change\n  in:  {:?}\n  out: {:?}",
        String::from_utf8_lossy(event_in),
        String::from_utf8_lossy(event_out),
    );
    let data_out = parsed_out.data.expect("the data lines are still there");
    assert_eq!(
        String::from_utf8_lossy(&data_out),
        String::from_utf8_lossy(&expected),
        "the event's data must change exactly at its top-level response ids"
    );
    // Restoring keeps valid JSON valid (a message the oracle reads by its
    // structure alone may hold invalid UTF-8 deeper in, which no restoring
    // makes valid).
    assert!(
        serde_json::from_slice::<serde::de::IgnoredAny>(&data_in).is_err()
            || serde_json::from_slice::<serde::de::IgnoredAny>(&data_out).is_ok(),
        "a JSON-RPC message is no longer valid JSON: {:?}",
        String::from_utf8_lossy(&data_out)
    );
    // The lines: the same, plus one per LF in the restored ids.
    let added: usize = restored
        .iter()
        .map(|(_, original)| original.matches('\n').count())
        .sum();
    assert_eq!(
        oracle::sse_lines(event_out).len(),
        oracle::sse_lines(event_in).len() + added,
        "restoring changed an event's lines"
    );
    Ok(())
}

/// Whether `event_out` is `event_in` with some of the server-side ids in its
/// data restored, where the data is nothing a strict JSON parser reads
/// (trailing bytes after the message, invalid UTF-8, a broken value deeper
/// in): the guard reads only a message's structure, and restores the ids of
/// what reads as a response to it; no client reads such data as the guard
/// does, but some read parts of it (`fetch` decodes invalid UTF-8 as
/// replacement characters). What stays forbidden there is any other change:
/// the output is the input with server-side id tokens replaced by exactly
/// the originals they carry.
fn unreadable_restored(event_in: &[u8], event_out: &[u8]) -> bool {
    let parsed_in = oracle::sse_event(event_in);
    let parsed_out = oracle::sse_event(event_out);
    let (Some(data_in), Some(data_out)) = (parsed_in.data, parsed_out.data) else {
        return false;
    };
    // Data the oracle reads had its restorations judged already.
    if parsed_in.other_lines != parsed_out.other_lines
        || oracle::read(&data_in, oracle::Writer::Server).is_some()
    {
        return false;
    }
    let (mut at_in, mut at_out) = (0, 0);
    while at_in < data_in.len() {
        let restored = (data_in[at_in] == b'"')
            .then(|| oracle::token_at(&data_in[at_in..]))
            .flatten()
            .and_then(|(token, len)| {
                let original = oracle::restore(token)?.replace('\r', " ");
                data_out[at_out..]
                    .starts_with(original.as_bytes())
                    .then_some((len, original.len()))
            });
        match restored {
            Some((len_in, len_out)) => {
                at_in += len_in;
                at_out += len_out;
            }
            None if data_out.get(at_out) == Some(&data_in[at_in]) => {
                at_in += 1;
                at_out += 1;
            }
            None => return false,
        }
    }
    at_out == data_out.len()
}

/// `data` (JSON) with every top-level response id that is a server-side
/// id replaced by the original it carries, as a client reads it from an
/// event (a CR in the original arrives as a space).
pub fn restored_data(data: &[u8]) -> Vec<u8> {
    let Some(body) = oracle::read(data, oracle::Writer::Server) else {
        return data.to_vec();
    };
    let mut out = Vec::with_capacity(data.len());
    let mut cursor = 0;
    for message in body.messages() {
        let Some(range) = message
            .id
            .clone()
            .filter(|_| message.kind == Kind::Response)
        else {
            continue;
        };
        let Some(original) = std::str::from_utf8(&data[range.clone()])
            .ok()
            .and_then(oracle::restore)
        else {
            continue;
        };
        out.extend_from_slice(&data[cursor..range.start]);
        out.extend_from_slice(original.replace('\r', " ").as_bytes());
        cursor = range.end;
    }
    out.extend_from_slice(&data[cursor..]);
    out
}

/// A stream built from fuzz choices, with the output it must give.
#[derive(Debug, Default)]
pub struct Generated {
    /// What the server sends.
    pub stream: Vec<u8>,
    /// What the client must receive.
    pub expected: Vec<u8>,
    /// Some top-level server-side id has its prefix escaped.
    pub escaped_prefix: bool,
}

/// One JSON text as it is sent and as it must arrive, in parts between
/// which a `data:` line may break.
#[derive(Default)]
struct Json {
    parts: Vec<(String, String)>,
}

impl Json {
    fn same(&mut self, text: &str) -> &mut Self {
        self.parts.push((text.to_owned(), text.to_owned()));
        self
    }

    fn pair(&mut self, sent: &str, expected: &str) -> &mut Self {
        self.parts.push((sent.to_owned(), expected.to_owned()));
        self
    }
}

/// A server-side id and its original.
struct Minted {
    id: String,
    original: String,
}

fn mint(minter: &Minter, input: &mut Input<'_>) -> Minted {
    let original = id_text(input);
    let id = String::from_utf8(minter.mint(&original)).expect("minted ids are UTF-8");
    // An original with a line break is not restored (see `oracle::restore`).
    let original = if original.contains(['\r', '\n']) {
        id.clone()
    } else {
        original
    };
    Minted { id, original }
}

/// A response message carrying `id` (sent) / `restored` (expected).
fn response(input: &mut Input<'_>, nested: &str, sent: &str, expected: &str) -> Json {
    let mut json = Json::default();
    let error = input.flag();
    let payload = if error {
        format!("\"error\":{{\"code\":-32603,\"message\":\"m\",\"data\":{nested}}}")
    } else {
        format!("\"result\":{{\"content\":[],\"id\":{nested}}}")
    };
    match input.below(3) {
        0 => {
            json.same("{")
                .pair(&format!("\"id\":{sent},"), &format!("\"id\":{expected},"))
                .same("\"jsonrpc\":\"2.0\",")
                .same(&payload)
                .same("}");
        }
        1 => {
            json.same("{\"jsonrpc\":\"2.0\",")
                .same(&format!("{payload},"))
                .pair(&format!("\"id\":{sent}"), &format!("\"id\":{expected}"))
                .same("}");
        }
        _ => {
            json.same("{ \"jsonrpc\" : \"2.0\" ,")
                .pair(
                    &format!(" \"id\" :\t{sent} ,"),
                    &format!(" \"id\" :\t{expected} ,"),
                )
                .same(&format!(" {payload} }}"));
        }
    }
    json
}

/// Removes line breaks and defuses the reserved prefix in raw bytes.
fn sanitize(bytes: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = bytes
        .iter()
        .copied()
        .filter(|byte| *byte != b'\r' && *byte != b'\n')
        .collect();
    while let Some(at) = memchr_prefix(&out) {
        out[at + PREFIX.len() - 1] = b';';
    }
    out
}

/// Builds a stream of events from fuzz choices.
pub fn generate(input: &mut Input<'_>) -> Generated {
    let minter = Minter::default();
    let mut generated = Generated::default();
    let events = 1 + input.below(8);
    for _ in 0..events {
        event(input, &minter, &mut generated);
    }
    if input.flag() {
        let tail = sanitize(input.bytes(16));
        generated.stream.extend_from_slice(&tail);
        generated.expected.extend_from_slice(&tail);
    }
    generated
}

fn event(input: &mut Input<'_>, minter: &Minter, generated: &mut Generated) {
    let line_end = input.pick(&["\n", "\r\n", "\r"]);
    // A CR line end followed by an LF blank line would read as one CRLF.
    let blank = match line_end {
        "\r" => input.pick(&["\r", "\r\n"]),
        _ => input.pick(&["\n", "\r\n", "\r"]),
    };
    // (sent, expected) lines of the event.
    let mut lines: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let same = |lines: &mut Vec<(Vec<u8>, Vec<u8>)>, text: &[u8]| {
        lines.push((text.to_vec(), text.to_vec()));
    };
    if input.below(4) == 0 {
        let prelude = input.pick(&[
            &b"id: 7"[..],
            b"retry: 3000",
            b": keep-alive",
            b"event: message",
            b"event:",
            b"event",
            b"event: custom",
            b"id",
        ]);
        same(&mut lines, prelude);
    }
    let nested = mint(minter, input);
    let json: Option<Json> = match input.below(14) {
        // A response with a server-side id: restored.
        0..=3 => {
            let minted = mint(minter, input);
            Some(response(input, &nested.id, &minted.id, &minted.original))
        }
        // A response with a client id: unchanged, unless that id is itself
        // shaped like a server-side id.
        4 => {
            let id = input.pick(ID_POOL);
            let expected = oracle::restore(id).unwrap_or_else(|| id.to_owned());
            Some(response(input, &nested.id, id, &expected))
        }
        // A server request and a notification: never restored.
        5 => {
            let minted = mint(minter, input);
            let mut json = Json::default();
            json.same(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"sampling/createMessage\",\"result\":1}}",
                minted.id
            ));
            Some(json)
        }
        6 => {
            let mut json = Json::default();
            json.same(&format!(
                "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"id\":{},\"requestId\":{}}}}}",
                nested.id, nested.id
            ));
            Some(json)
        }
        // A batch: each response restored on its own.
        7 => {
            let mut json = Json::default();
            json.same("[");
            let members = 1 + input.below(4);
            for index in 0..members {
                if index > 0 {
                    json.same(",");
                }
                let minted = mint(minter, input);
                let member = match input.below(3) {
                    0 => response(input, &nested.id, &minted.id, &minted.original),
                    1 => response(input, "1", "7", "7"),
                    _ => {
                        let mut json = Json::default();
                        json.same(&format!("{{\"id\":{},\"method\":\"ping\"}}", minted.id));
                        json
                    }
                };
                json.parts.extend(member.parts);
            }
            json.same("]");
            Some(json)
        }
        // Not valid JSON, a duplicate id key, a null result, a look-alike
        // id: unchanged.
        8 => {
            let minted = mint(minter, input);
            let mut json = Json::default();
            let text = match input.below(7) {
                0 => format!("{{\"id\":{},\"result\":", minted.id),
                1 => format!("{{\"id\":{0},\"id\":{0},\"result\":{{}}}}", minted.id),
                2 => format!("{{\"id\":{},\"result\":null}}", minted.id),
                3 => format!("{{\"id\":{0},\"result\":{{}},\"id\":{0}}}", minted.id),
                4 => format!("{{\"result\":{{}},\"id\":{0},\"id\":{0}}}", minted.id),
                5 => format!(
                    "{{\"id\":{},\"result\":{{}},\"method\":\"ping\"}}",
                    minted.id
                ),
                _ => "{\"id\":\"mcp-id-guard:zz:1:1\",\"result\":{}}".to_owned(),
            };
            json.same(&text);
            Some(json)
        }
        // A server-side id with its prefix escaped: not how guards write
        // ids, not restored.
        9 => {
            let minted = mint(minter, input);
            let escaped = minted.id.replacen("\"mcp-", "\"\\u006dcp-", 1);
            generated.escaped_prefix = true;
            Some(response(input, "0", &escaped, &escaped))
        }
        // Raw bytes on a data or comment line.
        10 => {
            let raw = sanitize(input.bytes(24));
            let mut line = if input.flag() {
                b"data: ".to_vec()
            } else {
                b":".to_vec()
            };
            line.extend_from_slice(&raw);
            same(&mut lines, &line);
            None
        }
        // A priming event: an id and empty data.
        11 => {
            same(&mut lines, b"id: 0");
            same(&mut lines, b"data:");
            None
        }
        // Another event type: restored all the same.
        12 => {
            let minted = mint(minter, input);
            same(&mut lines, b"event: custom");
            let mut json = Json::default();
            json.same("{\"id\":")
                .pair(&minted.id, &minted.original)
                .same(",\"result\":{}}");
            Some(json)
        }
        // Server-side ids outside data lines: unchanged.
        _ => {
            let minted = mint(minter, input);
            same(&mut lines, format!("id: {}", minted.id).as_bytes());
            same(&mut lines, format!(": {}", minted.id).as_bytes());
            None
        }
    };
    if let Some(json) = json {
        // Break data lines between parts where the fuzz input says so.
        let mut sent = b"data: ".to_vec();
        let mut expected = b"data: ".to_vec();
        for (index, (part_sent, part_expected)) in json.parts.iter().enumerate() {
            if index > 0 && input.below(4) == 0 {
                lines.push((std::mem::take(&mut sent), std::mem::take(&mut expected)));
                let field = input.pick(&[&b"data: "[..], b"data:"]);
                sent.extend_from_slice(field);
                expected.extend_from_slice(field);
            }
            sent.extend_from_slice(part_sent.as_bytes());
            expected.extend_from_slice(part_expected.as_bytes());
        }
        lines.push((sent, expected));
        // The last `event:` line sets the type, even after the data.
        if input.below(4) == 0 {
            let type_line = input.pick(&[&b"event: custom"[..], b"event: message", b"event:"]);
            same(&mut lines, type_line);
        }
    }
    for (sent, expected) in lines {
        generated.stream.extend_from_slice(&sent);
        generated.stream.extend_from_slice(line_end.as_bytes());
        generated.expected.extend_from_slice(&expected);
        generated.expected.extend_from_slice(line_end.as_bytes());
    }
    generated.stream.extend_from_slice(blank.as_bytes());
    generated.expected.extend_from_slice(blank.as_bytes());
}
