use super::*;

fn scan_in(text: &[u8], cut: usize) -> Result<Vec<Found>, Malformed> {
    let mut scanner = Scanner::default();
    let mut events = Vec::new();
    for piece in text.chunks(cut.max(1)) {
        scanner.feed_into(piece, &mut events)?;
    }
    scanner.finish(&mut events)?;
    Ok(events)
}

#[test]
fn reports_keys_and_values_whatever_the_chunking() {
    let text = br#" {"id" : "a\"}b", "params":{"x":[1,{"y":"}"}]}, "n":-1.5e3, "long_key_past_the_prefix":0, "long\u0020key\"with\\escapes":1, "methods":2 } "#;
    let whole = scan_in(text, text.len()).unwrap();
    for cut in 1..text.len() {
        assert_eq!(scan_in(text, cut).unwrap(), whole, "cut {cut}");
    }
    let keys: Vec<&[u8]> = whole
        .iter()
        .filter_map(|event| match event {
            Found::Key { token, name, .. } => {
                assert_eq!(*name == KeyName::Id, &text[token.clone()] == b"\"id\"");
                assert_ne!(*name, KeyName::Method);
                Some(&text[token.clone()])
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        keys,
        [
            &b"\"id\""[..],
            b"\"params\"",
            b"\"n\"",
            b"\"long_key_past_the_prefix\"",
            br#""long\u0020key\"with\\escapes""#,
            b"\"methods\"",
        ]
    );
    let values: Vec<&[u8]> = whole
        .windows(2)
        .filter_map(|pair| match pair {
            [Found::ValueStart(start), Found::ValueEnd(end)] => Some(&text[*start..*end]),
            _ => None,
        })
        .collect();
    assert_eq!(
        values,
        [
            &br#""a\"}b""#[..],
            br#"{"x":[1,{"y":"}"}]}"#,
            b"-1.5e3",
            b"0",
            b"1",
            b"2"
        ]
    );
}

/// Written without whitespace, a key's colon and a value's comma are read
/// right after the token they follow; every cut reads the same events, and
/// what is malformed around them is refused, at every cut.
#[test]
fn a_compact_text_reads_alike_at_every_cut() {
    let text =
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"a":[1,2]},"n":null,"s":"x"}"#;
    let whole = scan_in(text, text.len()).unwrap();
    for cut in 1..text.len() {
        assert_eq!(scan_in(text, cut).unwrap(), whole, "cut {cut}");
    }
    let values = whole
        .iter()
        .filter(|event| matches!(event, Found::ValueEnd(_)))
        .count();
    assert_eq!(values, 6);
    for bad in [
        &br#"{"a":1,}"#[..],
        br#"{"a"::1}"#,
        br#"{"a":1,,"b":2}"#,
        br#"{"a":"x",}"#,
        br#"{"a":{},}"#,
        br#"{"a":1,:"b"}"#,
        br#"{"a",1}"#,
    ] {
        for cut in 1..=bad.len() {
            assert!(
                scan_in(bad, cut).is_err(),
                "{} cut {cut}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}

/// The searches that look at the first bytes themselves find what
/// memchr finds: in every haystack up to 3 * SHORT long with the sought
/// bytes at any one or two places, or nowhere.
#[test]
fn short_searches_find_what_memchr_finds() {
    let mut haystacks = Vec::new();
    for len in 0..=3 * SHORT {
        haystacks.push(vec![b'x'; len]);
        for first in 0..len {
            for (one, two) in [(b'"', b'\\'), (b'\\', b'"'), (b'{', b'}'), (b'}', b'"')] {
                let mut haystack = vec![b'x'; len];
                haystack[first] = one;
                haystacks.push(haystack.clone());
                for second in first + 1..len {
                    let mut haystack = haystack.clone();
                    haystack[second] = two;
                    haystacks.push(haystack);
                }
            }
        }
    }
    for haystack in &haystacks {
        assert_eq!(
            find2(b'"', b'\\', haystack),
            memchr::memchr2(b'"', b'\\', haystack)
        );
        assert_eq!(
            find3(b'"', b'{', b'}', haystack),
            memchr::memchr3(b'"', b'{', b'}', haystack)
        );
    }
}

#[test]
fn batches_report_each_message() {
    let text = br#"[{"id":1},7,"x",{"id":2},[]]"#;
    let events = scan_in(text, 3).unwrap();
    let starts = events
        .iter()
        .filter(|event| matches!(event, Found::MessageStart(_)))
        .count();
    let others = events
        .iter()
        .filter(|event| matches!(event, Found::OtherElement))
        .count();
    assert_eq!((starts, others), (2, 3));
}

#[test]
fn refuses_what_no_parser_reads() {
    for text in [
        &b"{\"id\" 1}"[..],
        b"{\"id\":1,}",
        b"{\"id\":1",
        b"{\"id\":1} x",
        b"[1,,2]",
        b"{1:2}",
        b"{\"a\":}",
    ] {
        assert!(scan_in(text, text.len()).is_err(), "{:?}", text);
    }
    assert!(scan_in(b"[]", 2).is_ok());
    assert!(scan_in(b"{}", 2).is_ok());
    assert!(scan_in(b"\"text\"", 2).is_ok());
}

// ---------------------------------------------------------------------------
// The block index against the byte path
// ---------------------------------------------------------------------------

use super::blocks::Nest;
use proptest::collection::vec;
use proptest::prelude::*;

/// Scans `text` cut into pieces of the sizes in `cuts` (taken in turn), by
/// the byte path alone or with the block index.
fn scan_cut(text: &[u8], cuts: &[usize], bytes_only: bool) -> Result<Vec<Found>, Malformed> {
    let mut scanner = Scanner {
        bytes_only,
        ..Scanner::default()
    };
    let mut events = Vec::new();
    let mut at = 0;
    for cut in cuts.iter().cycle() {
        if at >= text.len() {
            break;
        }
        let end = (at + cut.max(&1)).min(text.len());
        scanner.feed_into(&text[at..end], &mut events)?;
        at = end;
    }
    scanner.finish(&mut events)?;
    Ok(events)
}

/// Bits of JSON and of what is not: quotes, backslash runs of every length,
/// both bracket pairs, long plain strings, invalid UTF-8, control bytes.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => Just(b"\"".to_vec()),
        3 => (1..70usize).prop_map(|n| vec![b'\\'; n]),
        2 => Just(b"{".to_vec()),
        2 => Just(b"}".to_vec()),
        2 => Just(b"[".to_vec()),
        2 => Just(b"]".to_vec()),
        2 => Just(b",".to_vec()),
        1 => Just(b":".to_vec()),
        1 => Just(b" \n".to_vec()),
        2 => Just(br#""k":"v\"}]""#.to_vec()),
        2 => Just(br#"{"n":1,"t":["a","b"],"s":"x \"q\"\n"}"#.to_vec()),
        2 => (1..200usize).prop_map(|n| vec![b'x'; n]),
        1 => Just(vec![0xff, 0xfe, 0xc3, 0x28, 0x00, 0x1f]),
        1 => vec(any::<u8>(), 1..8),
    ]
}

/// JSON values, dense or long, with every kind of string content.
fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-z\"\\\\{}\\[\\]\n\u{e9}\u{1f600}]{0,12}".prop_map(Value::String),
        (0..300usize).prop_map(|n| Value::String("y".repeat(n))),
    ];
    leaf.prop_recursive(6, 200, 12, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..12).prop_map(Value::Array),
            vec(("[a-z\"\\\\{]{0,6}", inner), 0..12)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

/// Texts whose nested values the block index reads: a message or a batch
/// around random pieces, or around valid JSON with bytes overwritten.
fn text() -> impl Strategy<Value = Vec<u8>> {
    let frames = prop_oneof![
        Just((&br#"{"id":1,"params":{"#[..], &b"}}"[..])),
        Just((&br#"[{"result":["#[..], &b"]},7]"[..])),
        Just((&br#"{"a":["#[..], &br#"],"id":2}"#[..])),
    ];
    let random = (frames, vec(piece(), 0..60)).prop_map(|((head, tail), pieces)| {
        [head.to_vec(), pieces.concat(), tail.to_vec()].concat()
    });
    let mutated =
        (json(), vec((any::<prop::sample::Index>(), piece()), 0..3)).prop_map(|(value, edits)| {
            let mut text = format!(r#"{{"id":1,"params":{{"v":{value}}},"x":"\\"}}"#).into_bytes();
            for (at, piece) in edits {
                let at = at.index(text.len());
                text.splice(at..at + 1, piece);
            }
            text
        });
    prop_oneof![random, mutated]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The same events and the same refusals as the byte path, in any
    /// chunking.
    #[test]
    fn blocks_read_what_bytes_read(text in text(), cuts in vec(1..300usize, 1..6)) {
        let bytes = scan_cut(&text, &[text.len()], true);
        prop_assert_eq!(&scan_cut(&text, &cuts, true), &bytes);
        prop_assert_eq!(&scan_cut(&text, &[text.len()], false), &bytes);
        prop_assert_eq!(&scan_cut(&text, &cuts, false), &bytes);
    }

    /// Inside a nested value, from any state and for any bytes, chunk by
    /// chunk: the same end, or the same state at each chunk's end.
    #[test]
    fn nest_state_matches_bytes(
        bytes in vec(piece(), 0..40).prop_map(|pieces| pieces.concat()),
        depth in 1..4usize,
        array in any::<bool>(),
        in_string in any::<bool>(),
        escape in any::<bool>(),
        cuts in vec(1..300usize, 1..6),
    ) {
        let (open, close) = if array { (b'[', b']') } else { (b'{', b'}') };
        let start = Nest { open, close, depth, in_string, escape: escape && in_string };
        let (mut fast, mut slow) = (start, start);
        let mut at = 0;
        for cut in cuts.iter().cycle() {
            if at >= bytes.len() {
                break;
            }
            let chunk = &bytes[at..(at + cut).min(bytes.len())];
            let ended = slow.bytes(chunk, 0);
            prop_assert_eq!(fast.skip(chunk, 0), ended);
            if ended.is_some() {
                break;
            }
            prop_assert_eq!(fast, slow);
            at += chunk.len();
        }
    }
}

/// Hand-made edges: backslash runs and quotes on both sides of a block's
/// edge and of a chunk's, brackets in strings, deep nesting, strings that
/// never end.
#[test]
fn blocks_read_edges_as_bytes_do() {
    let mut texts: Vec<Vec<u8>> = Vec::new();
    for pad in 0..=130 {
        let x = "x".repeat(pad);
        for inner in [
            format!(r#""{x}\\\"}}""#),
            format!(r#""{x}\\\\"}}"#),
            format!(r#""{x}\""#),
            format!(r#""{x}"}}"#),
            format!(r#"[{x}\"]"]}}"#),
            format!(r#""{x}{{[}}]"}}"#),
            format!("\"{x}\u{e9}\u{ff}\"}}"),
        ] {
            texts.push(format!(r#"{{"id":1,"params":{{"a":{inner}}}"#).into_bytes());
        }
        let mut invalid = format!(r#"{{"id":1,"params":{{"{x}"#).into_bytes();
        invalid.extend_from_slice(&[0xff, 0xc0, b'"', b':', b'1', b'}', b'}']);
        texts.push(invalid);
    }
    let deep = format!(
        r#"{{"params":{}{}}}"#,
        "{\"a\":".repeat(300),
        "}".repeat(300)
    );
    texts.push(deep.into_bytes());
    texts.push(format!(r#"{{"params":[{}]}}"#, r#"{"s":"\\\\\\\"]"},"#.repeat(40)).into_bytes());
    // Long strings whose escapes are far apart, close together, or both.
    for gap in [1, 10, 63, 64, 65, 70, 200] {
        let line = format!("{}\\n", "w".repeat(gap));
        let doc = format!(
            "{}{}\\\"{}",
            line.repeat(20),
            "z".repeat(300),
            line.repeat(5)
        );
        texts.push(format!(r#"{{"params":{{"doc":"{doc}","n":[1]}}}}"#).into_bytes());
    }
    for text in &texts {
        let bytes = scan_cut(text, &[text.len()], true);
        for cut in [1, 7, 63, 64, 65, 100, text.len()] {
            assert_eq!(scan_cut(text, &[cut], false), bytes, "cut {cut}: {text:?}");
        }
    }
}
