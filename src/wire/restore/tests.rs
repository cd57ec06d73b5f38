use super::*;
use crate::wire::id::{id_key, IdMinter};

/// Feeds `body` to `restorer` in pieces of `cut` bytes, calling
/// `after_each` after every piece; returns what it handed on.
fn fed(
    restorer: &mut Restorer,
    body: &[u8],
    cut: usize,
    mut after_each: impl FnMut(&Restorer),
) -> VecDeque<Bytes> {
    let mut out = VecDeque::new();
    let mut base = 0;
    let pieces: Vec<&[u8]> = body.chunks(cut.max(1)).collect();
    for (index, piece) in pieces.iter().enumerate() {
        let chunk = Bytes::copy_from_slice(piece);
        let mut parts = vec![Part::Json(base..base + piece.len())];
        if index + 1 == pieces.len() {
            parts.push(Part::End(base + piece.len()));
        }
        restorer.push(&chunk, base, &parts, &mut out);
        after_each(restorer);
        base += piece.len();
    }
    restorer.finish(&mut out);
    out
}

/// Restores `body` fed in pieces of `cut` bytes.
fn restored_in(body: &[u8], cut: usize, watch: bool) -> (Vec<u8>, Vec<Delivered>) {
    let mut restorer = Restorer::new(1 << 20, watch);
    let out = fed(&mut restorer, body, cut, |_| {});
    let bytes = out.iter().flat_map(|piece| piece.iter().copied()).collect();
    let answered = restorer.take_answered().collect();
    (bytes, answered)
}

#[test]
fn restores_only_top_level_response_ids_in_any_chunking() {
    let minter = IdMinter::new();
    let server_id = String::from_utf8(minter.mint(r#""x""#)).unwrap();
    for (response, expected) in [
        (
            format!(r#"{{"jsonrpc":"2.0","id":{server_id},"result":{{"id":{server_id}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":"x","result":{{"id":{server_id}}}}}"#),
        ),
        // The TypeScript SDK writes the id last.
        (
            format!(r#"{{"jsonrpc":"2.0","result":{{"id":{server_id}}},"id":{server_id}}}"#),
            format!(r#"{{"jsonrpc":"2.0","result":{{"id":{server_id}}},"id":"x"}}"#),
        ),
        (
            format!(r#"{{"id":{server_id},"jsonrpc":"2.0","error":{{"code":1}}}}"#),
            r#"{"id":"x","jsonrpc":"2.0","error":{"code":1}}"#.to_owned(),
        ),
        // A server request and a null result are no responses.
        (
            format!(r#"{{"id":{server_id},"method":"sampling/createMessage"}}"#),
            format!(r#"{{"id":{server_id},"method":"sampling/createMessage"}}"#),
        ),
        (
            format!(r#"{{"id":{server_id},"result":null}}"#),
            format!(r#"{{"id":{server_id},"result":null}}"#),
        ),
    ] {
        for cut in 1..=response.len() {
            let (out, _) = restored_in(response.as_bytes(), cut, false);
            assert_eq!(String::from_utf8(out).unwrap(), expected, "cut {cut}");
        }
    }
}

/// Restores `body` split in two at `split`.
fn restored_split(body: &[u8], split: usize, watch: bool) -> (Vec<u8>, Vec<Delivered>) {
    let mut restorer = Restorer::new(1 << 20, watch);
    let mut out = VecDeque::new();
    let (head, tail) = body.split_at(split);
    let head = Bytes::copy_from_slice(head);
    restorer.push(&head, 0, &[Part::Json(0..split)], &mut out);
    let tail = Bytes::copy_from_slice(tail);
    let parts = [Part::Json(split..body.len()), Part::End(body.len())];
    restorer.push(&tail, split, &parts, &mut out);
    restorer.finish(&mut out);
    let bytes = out.iter().flat_map(|piece| piece.iter().copied()).collect();
    let answered = restorer.take_answered().collect();
    (bytes, answered)
}

#[test]
fn a_message_with_two_ids_or_a_method_passes_as_it_is() {
    // Parsers keep the first id, the last, or refuse the message: none is
    // restored, and none counts as answered, in any order and chunking.
    let minter = IdMinter::new();
    let s = String::from_utf8(minter.mint("1")).unwrap();
    for body in [
        format!(r#"{{"id":{s},"result":{{}},"id":{s}}}"#),
        format!(r#"{{"id":{s},"id":{s},"result":{{}}}}"#),
        format!(r#"{{"result":{{}},"id":{s},"id":{s}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":{s},"error":{{"code":1}},"id":7}}"#),
        format!(r#"{{"id":7,"result":[{s}],"id":{s}}}"#),
        format!(r#"{{"result":1,"id":{s},"jsonrpc":"2.0","id":"x"}}"#),
        // A `method` makes it a request, before or after the result.
        format!(r#"{{"id":{s},"result":{{}},"method":"ping"}}"#),
        format!(r#"{{"result":{{}},"id":{s},"method":"ping"}}"#),
    ] {
        for watch in [false, true] {
            for split in 0..=body.len() {
                let (out, answered) = restored_split(body.as_bytes(), split, watch);
                assert_eq!(String::from_utf8(out).unwrap(), body, "split {split}");
                assert_eq!(answered, [], "split {split} of {body}");
            }
            for cut in 1..=body.len() {
                let (out, answered) = restored_in(body.as_bytes(), cut, watch);
                assert_eq!(String::from_utf8(out).unwrap(), body, "cut {cut}");
                assert_eq!(answered, [], "cut {cut} of {body}");
            }
        }
    }
    // In a batch, only that member passes as it is.
    let batch = format!(r#"[{{"id":{s},"result":1,"id":{s}}},{{"id":{s},"result":2}}]"#);
    let expected = format!(r#"[{{"id":{s},"result":1,"id":{s}}},{{"id":1,"result":2}}]"#);
    for split in 0..=batch.len() {
        let (out, answered) = restored_split(batch.as_bytes(), split, true);
        assert_eq!(String::from_utf8(out).unwrap(), expected, "split {split}");
        assert_eq!(answered, [(id_key("1"), true)]);
    }
}

/// A `method` that is not a string makes no request: the envelope reader
/// classifies such a message by its `result` (a response), as clients'
/// schemas do, and the restorer reads it alike (found by the SSE fuzz
/// target: `"method":{}` with a `result` was read as a response by one and
/// as a request by the other). Restored and answered in every chunking.
#[test]
fn a_method_that_is_no_string_makes_no_request() {
    let minter = IdMinter::new();
    let s = String::from_utf8(minter.mint("1")).unwrap();
    for method in ["{}", "null", "7", "[\"ping\"]"] {
        for (body, expected) in [
            (
                format!(r#"{{"id":{s},"method":{method},"result":{{}}}}"#),
                format!(r#"{{"id":1,"method":{method},"result":{{}}}}"#),
            ),
            (
                format!(r#"{{"result":{{}},"method":{method},"id":{s}}}"#),
                format!(r#"{{"result":{{}},"method":{method},"id":1}}"#),
            ),
        ] {
            let reading = crate::wire::envelope::peek(body.as_bytes());
            assert_eq!(
                reading.map(|peeked| peeked.messages()[0].kind),
                Some(crate::wire::envelope::Kind::Response),
                "the envelope reader's reading of {body}"
            );
            for split in 0..=body.len() {
                let (out, answered) = restored_split(body.as_bytes(), split, true);
                assert_eq!(String::from_utf8(out).unwrap(), expected, "split {split}");
                assert_eq!(answered, [(id_key("1"), true)], "split {split} of {body}");
            }
            for cut in 1..=body.len() {
                let (out, _) = restored_in(body.as_bytes(), cut, false);
                assert_eq!(String::from_utf8(out).unwrap(), expected, "cut {cut}");
            }
        }
    }
}

/// A key written with escapes is read by its decoded text, as the envelope
/// reader reads it: `"\u006dethod"` makes a request, `"r\u0065sult"` a
/// response (found by a review: the restorer named every escaped key
/// "other", so it restored, and counted as answered, a message the envelope
/// reader and Python's SDK take for a request, and passed a response on
/// unrestored). In every chunking, against the envelope reader's reading.
#[test]
fn escaped_envelope_keys_read_as_their_text() {
    use crate::wire::envelope::{peek, Kind};
    let minter = IdMinter::new();
    let s = String::from_utf8(minter.mint("1")).unwrap();
    for (body, restored) in [
        (
            format!(r#"{{"id":{s},"\u006dethod":"x","result":{{}}}}"#),
            None,
        ),
        (
            format!(r#"{{"id":{s},"result":{{}},"m\u0065thod":"x"}}"#),
            None,
        ),
        (
            format!(r#"{{"id":{s},"r\u0065sult":{{}}}}"#),
            Some(r#"{"id":1,"r\u0065sult":{}}"#.to_owned()),
        ),
        (
            format!(r#"{{"id":{s},"\u0065rror":{{"code":1}}}}"#),
            Some(r#"{"id":1,"\u0065rror":{"code":1}}"#.to_owned()),
        ),
        (
            format!(r#"{{"\u0069d":{s},"result":{{}}}}"#),
            Some(r#"{"\u0069d":1,"result":{}}"#.to_owned()),
        ),
        // A second id, escaped: ambiguous, as a plain one is.
        (format!(r#"{{"id":{s},"result":{{}},"\u0069d":{s}}}"#), None),
    ] {
        let kind = peek(body.as_bytes()).map(|peeked| peeked.messages()[0].kind);
        let expected = restored.clone().unwrap_or_else(|| body.clone());
        let answered: Vec<Delivered> = match restored {
            Some(_) => vec![(id_key("1"), true)],
            None => vec![],
        };
        if kind.is_some() {
            assert_eq!(
                kind == Some(Kind::Response),
                restored.is_some(),
                "the envelope reader's reading of {body}: {kind:?}"
            );
        }
        for split in 0..=body.len() {
            let (out, got) = restored_split(body.as_bytes(), split, true);
            assert_eq!(String::from_utf8(out).unwrap(), expected, "split {split}");
            assert_eq!(got, answered, "split {split} of {body}");
        }
        for cut in 1..=body.len() {
            let (out, _) = restored_in(body.as_bytes(), cut, false);
            assert_eq!(String::from_utf8(out).unwrap(), expected, "cut {cut}");
        }
    }
}

/// Where the window after a response's id ends, a second `id` or a
/// `method` decides by its value's first byte, which is in the chunk being
/// read: the output is the same wherever a chunk ends around the key (found
/// by a review: decided at the key's first byte, a chunk end inside the
/// key, past the window, restored what the unsplit text passed on).
#[test]
fn a_key_at_the_window_end_decides_alike_in_every_chunking() {
    let minter = IdMinter::new();
    let s = String::from_utf8(minter.mint("1")).unwrap();
    let head = format!(r#"{{"id":{s},"result":""#);
    for tail in [r#","id":2}"#, r#","method":"x"}"#] {
        // The key lands from a few bytes before the window's end to a few
        // after it.
        for pad in WINDOW - 16..WINDOW - 4 {
            let body = format!("{head}{}\"{tail}", "a".repeat(pad));
            let key = head.len() + pad + 2;
            let whole = restored_split(body.as_bytes(), body.len(), true);
            for split in key - 2..(key + 12).min(body.len()) {
                assert_eq!(
                    restored_split(body.as_bytes(), split, true),
                    whole,
                    "pad {pad}, split {split}, tail {tail}"
                );
            }
        }
    }
}

/// An answer counts only under an id that has a collision key: a server's
/// `{"id":null,"error":...}` (its reply to a message it could not parse)
/// answers no request, and keyed by its text it freed a client's string id
/// `"null"` (found by a review). Ids the request path refuses (objects,
/// `true`) answer nothing either.
#[test]
fn an_id_without_a_key_answers_nothing() {
    for body in [
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#,
        r#"{"jsonrpc":"2.0","id":true,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":{"a":1},"result":{}}"#,
    ] {
        for cut in 1..=body.len() {
            let (out, answered) = restored_in(body.as_bytes(), cut, true);
            assert_eq!(out, body.as_bytes(), "cut {cut}");
            assert_eq!(answered, [], "cut {cut} of {body}");
        }
    }
    let body = r#"{"jsonrpc":"2.0","id":"null","result":{}}"#;
    let (_, answered) = restored_in(body.as_bytes(), body.len(), true);
    assert_eq!(answered, [(id_key(r#""null""#), false)]);
}

#[test]
fn restores_each_response_of_a_batch() {
    let minter = IdMinter::new();
    let a = String::from_utf8(minter.mint("1")).unwrap();
    let b = String::from_utf8(minter.mint("2")).unwrap();
    let batch =
        format!(r#"[{{"id":{a},"result":1}},{{"id":7,"result":2}},{{"id":{b},"error":{{}}}}]"#);
    for cut in [1, 3, 7, batch.len()] {
        let (out, answered) = restored_in(batch.as_bytes(), cut, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"[{"id":1,"result":1},{"id":7,"result":2},{"id":2,"error":{}}]"#
        );
        assert_eq!(
            answered,
            [
                (id_key("1"), true),
                (id_key("7"), false),
                (id_key("2"), true)
            ]
        );
    }
}

#[test]
fn remembers_a_bounded_number_of_answers_per_text() {
    let many: Vec<String> = (0..MAX_ANSWERING + 100)
        .map(|n| format!(r#"{{"id":{n},"result":1}}"#))
        .collect();
    let batch = format!("[{}]", many.join(","));
    let (out, answered) = restored_in(batch.as_bytes(), 4096, true);
    assert_eq!(out, batch.as_bytes());
    assert_eq!(answered.len(), MAX_ANSWERING);
}

#[test]
fn holds_at_most_the_id_and_a_window() {
    let minter = IdMinter::new();
    let server_id = String::from_utf8(minter.mint("1")).unwrap();
    // Something the server put between the id and the result, larger
    // than the window: the message goes on as it is.
    let filler = "a".repeat(WINDOW + 10);
    let body = format!(r#"{{"id":{server_id},"x":"{filler}","result":{{}}}}"#);
    let (out, _) = restored_in(body.as_bytes(), 4096, false);
    assert_eq!(out, body.as_bytes());
    // A response is held for the window after its id at most: a second
    // `id` past it is not caught, and the payload goes on as it arrives.
    let body = format!(r#"{{"id":{server_id},"result":"{filler}","id":2}}"#);
    for cut in [1000, 4096, WINDOW, body.len()] {
        let (out, _) = restored_in(body.as_bytes(), cut, false);
        let expected = format!(r#"{{"id":1,"result":"{filler}","id":2}}"#);
        assert!(out == expected.as_bytes(), "cut {cut}");
    }
    let body = format!(r#"{{"id":{server_id},"x":"{filler}","result":{{}}}}"#);
    let mut restorer = Restorer::new(1 << 20, false);
    let mut out = VecDeque::new();
    let chunk = Bytes::from(body.clone());
    restorer.push(&chunk, 0, &[Part::Json(0..body.len())], &mut out);
    assert!(restorer.held.is_none(), "released once over the window");
}

#[test]
fn a_server_side_id_carrying_the_longest_client_id_is_restored() {
    // `max_id` is the longest id a client could send (the body limit);
    // the server-side id carrying it is longer.
    let minter = IdMinter::new();
    for original in ["1", r#""\"\\""#, "[\t\t\t\t\t\t\t\t\t\t\t\t1]"] {
        let server_id = String::from_utf8(minter.mint(original)).unwrap();
        let body = format!(r#"{{"id":{server_id},"result":{{}}}}"#);
        for watch in [false, true] {
            let mut restorer = Restorer::new(original.len(), watch);
            let mut out = VecDeque::new();
            let chunk = Bytes::from(body.clone());
            let parts = [Part::Json(0..body.len()), Part::End(body.len())];
            restorer.push(&chunk, 0, &parts, &mut out);
            restorer.finish(&mut out);
            let out: Vec<u8> = out.iter().flat_map(|piece| piece.to_vec()).collect();
            let expected = format!(r#"{{"id":{original},"result":{{}}}}"#);
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }
}

#[test]
fn whole_bodies() {
    let minter = IdMinter::new();
    let server_id = String::from_utf8(minter.mint("[1]")).unwrap();
    let body = format!(r#"{{"jsonrpc":"2.0","id":{server_id},"result":{{}}}}"#);
    assert_eq!(
        restore_whole(body.as_bytes()).unwrap(),
        br#"{"jsonrpc":"2.0","id":[1],"result":{}}"#
    );
    assert_eq!(restore_whole(br#"{"id":1,"result":{}}"#), None);
}

/// A restorer that only watches (its request was not remapped) learns the
/// same answers as one that restores, in any chunking, while it copies only
/// the id and hands nothing on: its caller sends the chunks as they came.
#[test]
fn watching_only_learns_the_same_answers_and_hands_nothing_on() {
    let watched =
        |body: &[u8], cut: usize| {
            let mut restorer = Restorer::new(1 << 20, true).without_restoring();
            let out =
                fed(&mut restorer, body, cut, |restorer| {
                    assert!(
                        restorer.held.as_ref().is_none_or(|held| held
                            .id_len
                            .is_none_or(|id_len| held.bytes.as_bytes().len() <= id_len)),
                        "only the id is kept once it ended"
                    );
                });
            assert!(out.is_empty(), "nothing handed on");
            restorer.take_answered().collect::<Vec<_>>()
        };
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}"#,
        r#"{"jsonrpc":"2.0","result":{"id":2},"id":"abc"}"#,
        r#"{"id":1,"jsonrpc":"2.0","error":{"code":-32000,"message":"x"}}"#,
        r#"{"id":1,"result":{},"id":2}"#,
        r#"{"id":1,"method":"ping"}"#,
        r#"{"id":1,"result":null}"#,
        r#"[{"id":1,"result":{}},{"id":"b","error":{"code":1}},{"id":3,"method":"x"}]"#,
        r#"{"id":1,"result":{"#,
    ] {
        for cut in 1..=body.len() {
            let (out, expected) = restored_in(body.as_bytes(), cut, true);
            assert_eq!(
                out,
                body.as_bytes(),
                "the restoring reader's output is the body"
            );
            assert_eq!(watched(body.as_bytes(), cut), expected, "{body} cut {cut}");
        }
    }
}
