use super::*;

fn single(input: &str) -> Message {
    match read(input.as_bytes()) {
        Reading::Read(Peeked::Single(message)) => message,
        other => panic!("expected a single message, got {other:?}"),
    }
}

#[test]
fn finds_request_id_offsets() {
    let body = r#"{"jsonrpc":"2.0","id": "a\"b" ,"method":"x","params":{"id":9}}"#;
    let message = single(body);
    assert_eq!(message.kind, Kind::Request);
    assert_eq!(&body[message.id.unwrap()], r#""a\"b""#);
}

#[test]
fn kinds() {
    assert_eq!(single(r#"{"method":"n"}"#).kind, Kind::Notification);
    assert_eq!(
        single(r#"{"method":"n","id":null}"#).kind,
        Kind::Notification
    );
    assert_eq!(single(r#"{"id":1,"result":{}}"#).kind, Kind::Response);
    assert_eq!(
        single(r#"{"id":1,"error":{"code":1}}"#).kind,
        Kind::Response
    );
    assert_eq!(single(r#"{"id":1,"method":7}"#).kind, Kind::Other);
    assert_eq!(single(r#"{"id":1}"#).kind, Kind::Other);
    // A null `result` answers nothing, and so does a malformed value that
    // starts as `null` does: the restorer decides at that first byte too
    // (the sse_rewriter fuzz target found the two reading `null!…` apart).
    assert_eq!(single(r#"{"id":1,"result":null}"#).kind, Kind::Other);
    let malformed = read(b"{\"id\":1,\"result\":null!\x19!}");
    if let Reading::Read(Peeked::Single(message)) = malformed {
        assert_eq!(message.kind, Kind::Other);
    }
}

#[test]
fn rejects_non_json_and_duplicate_keys() {
    assert_eq!(peek(b""), None);
    assert_eq!(peek(b"{"), None);
    assert_eq!(peek(b"12"), None);
    assert_eq!(peek(br#"" {}""#), None);
    assert_eq!(peek(br#"{"id":1,"id":2,"method":"x"}"#), None);
}

#[test]
fn batch_offsets_point_into_the_whole_body() {
    let body = r#"[{"id":1,"method":"a"}, [2,"m"], {"method":"n"}, {"id":"z","result":1}]"#;
    let Some(Peeked::Batch(messages)) = peek(body.as_bytes()) else {
        panic!("batch expected")
    };
    assert_eq!(messages.len(), 4);
    assert_eq!(&body[messages[0].id.clone().unwrap()], "1");
    assert_eq!(messages[1].kind, Kind::Other);
    assert_eq!(messages[2].kind, Kind::Notification);
    assert_eq!(&body[messages[3].id.clone().unwrap()], r#""z""#);
}

#[test]
fn finds_the_cancelled_request_id() {
    let body = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"x","requestId":"a"}}"#;
    let message = single(body);
    assert_eq!(message.kind, Kind::Notification);
    assert_eq!(&body[message.cancels.unwrap()], r#""a""#);
    assert_eq!(
        single(r#"{"method":"notifications/cancelled","params":{}}"#).cancels,
        None
    );
    assert_eq!(
        single(r#"{"method":"other","params":{"requestId":1}}"#).cancels,
        None
    );
    assert_eq!(
        single(r#"{"method":"notifications/cancelled","params":{"requestId":null}}"#).cancels,
        None
    );
}

/// Every string token of up to 4 symbols from an alphabet of escapes,
/// control characters, non-ASCII and invalid UTF-8: the shortcut for
/// strings without escapes reads what serde_json reads, and refuses what
/// it refuses.
#[test]
fn plain_strings_read_as_serde_reads_them() {
    let alphabet: [&[u8]; 17] = [
        b"a",
        b" ",
        b"\"",
        b"\\",
        b"u",
        b"0",
        b"/",
        b"\x00",
        b"\x1f",
        b"\x7f",
        b"\xc3\xa9",
        b"\xc3",
        b"\xa9",
        b"\xff",
        b"\xed\xa0\x80",
        b"\xf0\x9f\x98\x80",
        b"\\u00e9",
    ];
    let mut texts: Vec<Vec<u8>> = vec![Vec::new()];
    let mut last = texts.clone();
    for _ in 0..4 {
        last = last
            .iter()
            .flat_map(|text| {
                alphabet
                    .iter()
                    .map(move |symbol| [&text[..], symbol].concat())
            })
            .collect();
        texts.extend(last.iter().cloned());
    }
    let mut plain = 0;
    for text in &texts {
        let token = [&b"\""[..], text, b"\""].concat();
        let serde = serde_json::from_slice::<String>(&token).ok();
        let ours = string_text(&token).map(Cow::into_owned);
        assert_eq!(ours, serde.map(String::into_bytes), "{token:?}");
        assert_eq!(is_utf8(text), std::str::from_utf8(text).is_ok(), "{text:?}");
        plain += usize::from(plain_string(&token).is_some());
    }
    // Both readings were compared.
    assert!(plain > 10_000 && texts.len() - plain > 10_000, "{plain}");
}

#[test]
fn reading_like_the_servers() {
    let refused = |body: &[u8]| match read(body) {
        Reading::Unreadable(why) => Some(why),
        _ => None,
    };
    // A duplicate hidden after a large payload, and one spelled with an escape.
    let mut hidden = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":""#.to_vec();
    hidden.extend(std::iter::repeat_n(b'a', 100_000));
    hidden.extend_from_slice(br#""},"id":2}"#);
    assert_eq!(refused(&hidden), Some(Unreadable::DuplicateKey));
    assert_eq!(
        refused(br#"{"id":1,"\u0069d":2,"method":"m"}"#),
        Some(Unreadable::DuplicateKey)
    );
    assert_eq!(
        refused(br#"{"id":1,"method":"m","params":{},"params":{}}"#),
        Some(Unreadable::DuplicateKey)
    );
    assert_eq!(
        refused(br#"{"method":"notifications/cancelled","params":{"requestId":1,"requestId":2}}"#),
        Some(Unreadable::DuplicateKey)
    );
    assert_eq!(
        refused(br#"{"id":1e400,"method":"m"}"#),
        Some(Unreadable::Id)
    );
    assert_eq!(
        refused(br#"{"id":true,"method":"m"}"#),
        Some(Unreadable::Id)
    );
    assert_eq!(
        refused(br#"{"id":"\ud800","method":"m"}"#),
        Some(Unreadable::Id)
    );
    assert_eq!(
        refused(br#"{"id":1,"method":"m""#),
        Some(Unreadable::Malformed)
    );
    // Past the keys compared pairwise, a set finds the repeat (plain or
    // escaped), in any message of a batch.
    let keys = |count: usize, last: &str| {
        let mut body = String::from(r#"[{"id":1,"method":"m"},{"id":2,"method":"m""#);
        for n in 0..count {
            body.push_str(&format!(r#","k{n}":{n}"#));
        }
        body.push_str(&format!(r#",{last}:0}}]"#));
        body
    };
    for count in [5, 6, 7, 8, 20] {
        assert!(matches!(
            read(keys(count, r#""z""#).as_bytes()),
            Reading::Read(_)
        ));
        for repeat in [r#""k0""#, r#""\u006b4""#, r#""method""#, r#""\u0069d""#] {
            assert_eq!(
                refused(keys(count, repeat).as_bytes()),
                Some(Unreadable::DuplicateKey),
                "{count} {repeat}"
            );
        }
    }
    assert_eq!(refused(b"\xFF\xFE{\x00}\x00"), Some(Unreadable::NotUtf8));
    assert_eq!(refused(b"{\x00\x00\x00"), Some(Unreadable::NotUtf8));
    assert_eq!(refused(b"\xEF\xBB\xBF{}"), Some(Unreadable::Malformed));
    assert_eq!(read(b"method=tools/call"), Reading::NotJsonRpc);
    assert_eq!(read(b""), Reading::NotJsonRpc);
    // An escaped key and an escaped method are what the server reads.
    let message = single(r#"{"\u0069d":1.0,"method":"tools\/call"}"#);
    assert_eq!(message.kind, Kind::Request);
    let cancel = single(r#"{"method":"notifications\/cancelled","params":{"requestId":"a"}}"#);
    assert!(cancel.cancels.is_some());
    // The payload is not validated.
    assert_eq!(
        single(r#"{"id":1,"method":"m","params":{"x":NaN}}"#).kind,
        Kind::Request
    );
}

#[test]
fn keeps_the_method_token_of_requests_and_notifications() {
    use crate::wire::method::McpMethod;
    let body = r#"[{"id":1,"method":"tools\/call"},{"method":"notifications/cancelled","params":{"requestId":1}},{"id":2,"result":{}},{"\u006dethod":"ping","id":3},7]"#;
    let Reading::Read(Peeked::Batch(messages)) = read(body.as_bytes()) else {
        panic!("a batch");
    };
    let methods: Vec<_> = messages
        .iter()
        .map(|message| {
            message
                .method
                .clone()
                .map(|range| McpMethod::from_token(&body.as_bytes()[range]))
        })
        .collect();
    assert_eq!(
        methods,
        [
            Some(McpMethod::ToolsCall),
            Some(McpMethod::NotificationsCancelled),
            None,
            Some(McpMethod::Ping),
            None
        ]
    );
    assert_eq!(
        &body[messages[0].method.clone().unwrap()],
        r#""tools\/call""#
    );
    // A method that is no string makes no request and keeps no token.
    assert_eq!(single(r#"{"id":1,"method":7}"#).method, None);
}

#[test]
fn reads_a_tool_name_from_params_on_demand() {
    let name = |body: &str| {
        let message = single(body);
        let params = message.params?;
        tool_name(body.as_bytes(), params).map(|name| String::from_utf8(name.into_owned()).unwrap())
    };
    assert_eq!(
        name(
            r#"{"id":1,"method":"tools/call","params":{"arguments":{"name":"inner"},"name":"outer"}}"#
        ),
        Some("outer".to_owned())
    );
    assert_eq!(
        name(r#"{"id":1,"method":"tools/call","params":{"n\u0061me":"e\u0063ho"}}"#),
        Some("echo".to_owned())
    );
    assert_eq!(
        name(r#"{"id":1,"method":"tools/call","params":{"name":7}}"#),
        None
    );
    assert_eq!(name(r#"{"id":1,"method":"tools/call","params":{}}"#), None);
    assert_eq!(name(r#"{"id":1,"method":"tools/call","params":[1]}"#), None);
    // Only a request keeps its params.
    assert_eq!(
        name(r#"{"method":"tools/call","params":{"name":"x"}}"#),
        None
    );
}
