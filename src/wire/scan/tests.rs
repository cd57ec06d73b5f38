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
