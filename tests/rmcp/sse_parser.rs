//! The harness's one SSE parser reads every line ending the same way: CR,
//! LF and CRLF, bare-CR event boundaries included.

use crate::support::sse::{data, events, Event};

#[test]
fn line_endings_cr_lf_and_crlf_read_alike() {
    let expected = vec![
        Event {
            id: Some("1".into()),
            data: "a\nb".into(),
            ..Event::default()
        },
        Event {
            event: Some("message".into()),
            data: "c".into(),
            ..Event::default()
        },
    ];
    let lf = "id: 1\ndata: a\ndata: b\n\n: keep-alive\n\nevent: message\ndata:c\n\n";
    assert_eq!(events(lf), expected);
    assert_eq!(events(&lf.replace('\n', "\r\n")), expected);
    assert_eq!(events(&lf.replace('\n', "\r")), expected);
    // Mixed endings, and a bare-CR event boundary right after a CRLF line.
    let mixed = "id: 1\r\ndata: a\rdata: b\n\r: keep-alive\r\n\nevent: message\rdata:c\r\r";
    assert_eq!(events(mixed), expected);
}

#[test]
fn only_complete_events_count() {
    assert_eq!(events("data: x\n"), vec![]);
    assert_eq!(events("data: x\r"), vec![]);
    assert_eq!(data("data: x\n\ndata: y"), ["x"]);
    // A bare CR that ends the chunk ends the line; its LF, arriving later,
    // makes one CRLF.
    assert_eq!(data("data: x\r\n\r"), ["x"]);
    assert_eq!(data("data: x\r\n\r\n"), ["x"]);
}
