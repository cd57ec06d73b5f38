//! The scanner on answers in any split, batches, escaped keys, odd ids, what
//! is no answer, and against serde_json.

use serde_json::json;

use super::*;

/// The answer in `text`, fed in pieces of `step` bytes.
fn scanned(text: &str, step: usize) -> Option<Answer> {
    let mut scanner = Scanner::default();
    for piece in text.as_bytes().chunks(step.max(1)) {
        if let Some(answer) = scanner.feed(piece) {
            return Some(answer);
        }
    }
    scanner.finish()
}

#[test]
fn answers_in_any_split() {
    let text = r#" {"jsonrpc":"2.0","result":{"tools":[{"name":"x","inputSchema":{"a":[1,2,{"b":"c\"}"}]}}],"content":null},"id":7} "#;
    for step in 1..text.len() {
        let answer = scanned(text, step).expect("an answer");
        assert_eq!(answer.id, json!(7), "step {step}");
        assert_eq!(answer.shape, Shape::Tools);
    }
    let error = r#"{"id":"a\"b","error":{"message":"no \u0073uch","data":[1],"code":-32601},"jsonrpc":"2.0"}"#;
    for step in 1..error.len() {
        let answer = scanned(error, step).expect("an answer");
        assert_eq!(answer.id, json!("a\"b"));
        assert_eq!(answer.shape, Shape::Error(-32601));
        assert_eq!(answer.error_message.as_deref(), Some("no such"));
    }
}

#[test]
fn initialize_answers_keep_the_server() {
    let text = r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"echo","version":"1.2","title":{"x":1}},"instructions":"..."}}"#;
    let answer = scanned(text, 3).unwrap();
    assert_eq!(answer.protocol_version.as_deref(), Some("2025-06-18"));
    assert_eq!(
        answer.server,
        Some(json!({"name": "echo", "version": "1.2"}))
    );
    assert_eq!(answer.shape, Shape::Other);
}

#[test]
fn the_first_response_of_a_batch() {
    let text =
        r#"[{"jsonrpc":"2.0","method":"x"}, 5, {"id":1,"error":{"code":1}}, {"id":2,"result":{}}]"#;
    let answer = scanned(text, 4).unwrap();
    assert_eq!((answer.id, answer.shape), (json!(1), Shape::Error(1)));
    assert_eq!(scanned(r#"[{"jsonrpc":"2.0","method":"x"}]"#, 2), None);
}

#[test]
fn keys_may_be_escaped_and_ids_may_be_odd() {
    let answer = scanned(r#"{"\u0069d":null,"re\u0073ult":{"content":[]}}"#, 1).unwrap();
    assert_eq!((answer.id, answer.shape), (Value::Null, Shape::Content));
    let answer = scanned(r#"{"id":{"a":1},"result":{}}"#, 1).unwrap();
    assert_eq!(answer.id, json!("(an object or array)"));
    let long = format!(r#"{{"id":"{}","result":{{}}}}"#, "x".repeat(10_000));
    let answer = scanned(&long, 7).unwrap();
    assert!(answer
        .id
        .as_str()
        .unwrap()
        .ends_with("(longer than 512 bytes)"));
    let answer = scanned(r#"{"id":1e2,"result":{}}"#, 1).unwrap();
    assert_eq!(answer.id, json!(100.0));
}

#[test]
fn what_is_not_an_answer() {
    for text in [
        "",
        "7",
        "null",
        r#"{"jsonrpc":"2.0","method":"ping","id":1}"#,
        r#"{"result":{}}"#,
        r#"{"id":1,"result":{}"#,
        r#"{"id":1 "result":{}}"#,
        r#"{"id":1,"result":{]}"#,
        r#"{"id":1,,"result":{}}"#,
        r#"{id:1,"result":{}}"#,
    ] {
        assert_eq!(scanned(text, 1), None, "{text:?}");
    }
    // A raw control character in a string is skipped unchecked, but the
    // kept id it is in does not read as one.
    let answer = scanned("{\"id\":\"a\nb\",\"result\":{}}", 1).unwrap();
    assert_eq!(answer.id, json!("(not valid JSON)"));
    let deep = format!(
        r#"{{"id":1,"x":{}1{},"result":{{}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    assert_eq!(scanned(&deep, 64), None);
    let fine = format!(
        r#"{{"id":1,"x":{}1{},"result":{{}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    assert!(scanned(&fine, 64).is_some());
}

/// Whatever serde_json reads as a response, the scanner reads the same
/// id and shape from.
#[test]
fn agrees_with_serde_json() {
    for text in [
        r#"{"jsonrpc":"2.0","id":"7","result":{"content":[{"type":"text","text":"}]\\\""}]}}"#,
        r#"{"id":-1.5,"error":{"code":-32000,"message":"x"}}"#,
        r#"[{"id":3,"result":{"tools":[]}}]"#,
        r#"{"id":true,"result":[]}"#,
    ] {
        let value: Value = serde_json::from_str(text).unwrap();
        let value = match value {
            Value::Array(items) => items.into_iter().next().unwrap(),
            value => value,
        };
        let answer = scanned(text, 2).unwrap();
        assert_eq!(answer.id, value["id"], "{text}");
        assert_eq!(answer.shape, Shape::of(&value), "{text}");
    }
}
