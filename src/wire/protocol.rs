//! Facts of the MCP streamable-HTTP transport that the guard and the proxy
//! both read off requests and responses: header names, protocol revisions,
//! media types.

use http::header::{HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
use http::HeaderMap;

use crate::wire::method::McpMethod;

/// The session header of the legacy streamable-HTTP revisions (2025-03-26 to
/// 2025-11-25). Header names are case-insensitive.
pub(crate) static MCP_SESSION_ID: HeaderName = HeaderName::from_static(SESSION_ID);

// The names as text, for matching a name read off a request.
const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";
/// The method of a POST's message, in revision 2026-07-28 (servers answer
/// 400 when it differs from the body's).
const METHOD: &str = "mcp-method";

/// The first protocol revision without sessions (2026-07-28): each response
/// comes back on its own POST there, so ids cannot cross-wire.
const FIRST_SESSIONLESS_REVISION: &str = "2026-07-28";

/// Revisions are dates (`YYYY-MM-DD`), which order as strings.
pub(crate) fn is_sessionless_revision(version: &[u8]) -> bool {
    let Some(date) = version.get(..10) else {
        return false;
    };
    let shaped = date.iter().enumerate().all(|(index, byte)| match index {
        4 | 7 => *byte == b'-',
        _ => byte.is_ascii_digit(),
    });
    shaped && date >= FIRST_SESSIONLESS_REVISION.as_bytes()
}

/// The request headers the guard decides on, read in one pass over the map:
/// each lookup of a custom header such as `Mcp-Session-Id` hashes its name
/// byte by byte, and the guard needs six.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RequestHeaders {
    /// The first `Mcp-Session-Id` (what `HeaderMap::get` returns).
    pub(crate) session: Option<HeaderValue>,
    /// There is more than one `Mcp-Session-Id`.
    pub(crate) several_sessions: bool,
    /// Some `Mcp-Session-Id` holds a byte outside visible ASCII (see
    /// [`is_session_id`]).
    pub(crate) odd_session: bool,
    /// The first `MCP-Protocol-Version` names a revision without sessions.
    pub(crate) sessionless: bool,
    /// The first `Content-Length`, when it is a number.
    pub(crate) content_length: Option<u64>,
    /// Some `Content-Encoding` value is not `identity`.
    pub(crate) encoded: bool,
    /// The first `Mcp-Method` (revision 2026-07-28 names each POST's method
    /// in it), read against the closed list; `Other` when absent.
    pub(crate) method: McpMethod,
    /// A `Connection` header names a header some layer of the crate decides
    /// on ([`DECIDED_ON`]): a proxy on the way drops that header, so the
    /// server would read the request without it.
    pub(crate) hides_decided_on: bool,
}

/// The request headers some layer of the crate decides on: the guard (the
/// session, its revision, the body's length, type and coding, a resumed
/// stream), the metrics and trace layers (the method, the trace context), the
/// host check. A `Connection` header that names one of them makes every
/// proxy on the way drop it (RFC 9110 §7.6.1), so the server would read a
/// request other than the one the layers read: the guard refuses it rather
/// than decide on a view the server never gets (a session POST whose
/// `Connection` named `MCP-Protocol-Version` went untracked, and reached the
/// upstream as a legacy-revision request routed by id). Refusing holds in
/// every face alike, in process too, where nothing strips the header.
const DECIDED_ON: [&str; 15] = [
    SESSION_ID,
    PROTOCOL_VERSION,
    METHOD,
    "mcp-name",
    "last-event-id",
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "accept",
    "accept-encoding",
    "traceparent",
    "tracestate",
    "host",
    "origin",
];

/// Whether a session id is what the transport allows: visible ASCII only,
/// 0x21 to 0x7E (spec 2025-03-26 and later, transports). Anything else is
/// read differently on the way: HTTP/2 (the h2 crate) accepts a value with
/// a space or tab at either end, which every HTTP/1.1 parser strips, so
/// `abc ` was another session to the guard and session `abc` to the server
/// behind the proxy, and two `id: 1` of `abc` reached it in flight together.
fn is_session_id(value: &[u8]) -> bool {
    value.iter().all(|byte| (0x21..=0x7e).contains(byte))
}

/// Whether a `Connection` value names a header of [`DECIDED_ON`]. Read as
/// bytes, not only when the value is text: a proxy that reads a value with
/// other bytes in it still drops the names it recognises, so any token that
/// reads as one of them counts (a superset of what any proxy drops).
fn names_decided_on(value: &HeaderValue) -> bool {
    value
        .as_bytes()
        .split(|&byte| byte == b',')
        .map(<[u8]>::trim_ascii)
        .any(|token| {
            DECIDED_ON
                .iter()
                .any(|name| token.eq_ignore_ascii_case(name.as_bytes()))
        })
}

/// Whether a `Content-Encoding` value names a coding other than `identity`.
/// The value is a list (RFC 9110 §8.4: `#content-coding`, empty elements
/// allowed); `identity` means no coding, so a list of nothing else, or an
/// empty one (Express's body parser reads a missing or empty header as
/// `identity`), leaves the body as it is. Anything else is a body the guard
/// cannot read as it is.
fn encodes(value: &HeaderValue) -> bool {
    value
        .as_bytes()
        .split(|&byte| byte == b',')
        .map(<[u8]>::trim_ascii)
        .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity"))
}

/// Whether a message's body is encoded: some `Content-Encoding` value is not
/// `identity`. Requests and responses answer this the same way.
pub(crate) fn is_encoded(headers: &HeaderMap) -> bool {
    headers.get_all(CONTENT_ENCODING).iter().any(encodes)
}

/// A `Content-Length` value as `u64::from_str` reads its text (an optional
/// `+`, then digits, no overflow), without first checking the whole value is
/// text: only digits get through either way.
fn content_length(value: &[u8]) -> Option<u64> {
    let digits = value.strip_prefix(b"+").unwrap_or(value);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |length, &byte| {
        let digit = byte.checked_sub(b'0').filter(|digit| *digit < 10)?;
        length.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

impl RequestHeaders {
    pub(crate) fn read(headers: &HeaderMap) -> Self {
        let mut read = Self::default();
        let (mut version_seen, mut length_seen, mut method_seen) = (false, false, false);
        for (name, value) in headers {
            // One match on the name's text: the compiler sorts the arms by
            // length, so most names are passed over after one compare.
            match name.as_str() {
                "content-length" if !length_seen => {
                    length_seen = true;
                    read.content_length = content_length(value.as_bytes());
                }
                "content-encoding" => read.encoded |= encodes(value),
                "connection" => read.hides_decided_on |= names_decided_on(value),
                SESSION_ID => {
                    read.odd_session |= !is_session_id(value.as_bytes());
                    if read.session.is_some() {
                        read.several_sessions = true;
                    } else {
                        read.session = Some(value.clone());
                    }
                }
                METHOD if !method_seen => {
                    method_seen = true;
                    read.method = McpMethod::from_name(value.as_bytes());
                }
                PROTOCOL_VERSION if !version_seen => {
                    version_seen = true;
                    read.sessionless = is_sessionless_revision(value.as_bytes());
                }
                _ => {}
            }
        }
        read
    }

    /// The request belongs to a session, so the server routes its answers
    /// by id. Whatever `MCP-Protocol-Version` one request claims: a session
    /// exists only in the revisions that have them (2026-07-28 has no
    /// `initialize` to start one), and a server that speaks both revisions
    /// still routes a POST carrying a session id into that session. What the
    /// session negotiated, not what one request says, decides.
    pub(crate) fn in_legacy_session(&self) -> bool {
        self.session.is_some()
    }
}

/// Whether `headers` declare `media` as the content type (parameters and case
/// ignored). A value that is not visible ASCII declares nothing. `media` is a
/// bare media type such as `application/json` (no parameters, no spaces).
pub(crate) fn has_media_type(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|value| is_media_type(value.as_bytes(), media))
}

/// Whether a `Content-Type` value's media type, without parameters, is
/// `media`. Works on the bytes and checks that they are text (what
/// `HeaderValue::to_str` checks) only once the media type matched: most
/// values are compared and refused after a few bytes.
fn is_media_type(value: &[u8], media: &str) -> bool {
    debug_assert!(
        media
            .bytes()
            .all(|byte| byte.is_ascii_graphic() && byte != b';'),
        "{media:?} is not a bare media type"
    );
    let media_bytes = media.as_bytes();
    // The usual values: exactly the media type (which is text, without
    // parameters or spaces), or one that starts with another letter.
    if value == media_bytes {
        return true;
    }
    match (value.first(), media_bytes.first()) {
        (Some(b' ' | b'\t'), _) | (_, None) => {}
        (Some(first), Some(expected)) if first.eq_ignore_ascii_case(expected) => {}
        _ => return false,
    }
    let end = value
        .iter()
        .position(|&byte| byte == b';')
        .unwrap_or(value.len());
    // Text header values hold no whitespace but spaces and tabs, which
    // `trim_ascii` trims as `str::trim` would.
    value[..end].trim_ascii().eq_ignore_ascii_case(media_bytes)
        && value
            .iter()
            .all(|&byte| byte == b'\t' || (0x20..0x7f).contains(&byte))
}

#[cfg(test)]
mod tests {
    use http::header::CONTENT_LENGTH;
    use http::HeaderValue;
    use proptest::prelude::*;

    use super::*;

    /// How the media type was read first: the value as text, split, trimmed.
    fn model(headers: &HeaderMap, media: &str) -> bool {
        headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| {
                value
                    .split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .eq_ignore_ascii_case(media)
            })
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        let pieces = prop_oneof![
            Just(&b"application/json"[..]),
            Just(&b"Application/JSON"[..]),
            Just(&b"text/event-stream"[..]),
            Just(&b"application/jsonx"[..]),
            Just(&b" "[..]),
            Just(&b"\t"[..]),
            Just(&b";"[..]),
            Just(&b"charset=utf-8"[..]),
            Just(&b"\xe9"[..]),
            Just(&b"\x7f"[..]),
            Just(&b"\x0c"[..]),
            Just(&b"a"[..]),
        ];
        prop::collection::vec(pieces, 0..5).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn media_types_match_the_model(value in value(), media in 0..4usize) {
            let media = ["application/json", "text/event-stream", "a", ""][media];
            let mut headers = HeaderMap::new();
            // Values `HeaderValue` refuses cannot reach the check.
            if let Ok(value) = HeaderValue::from_bytes(&value) {
                headers.insert(CONTENT_TYPE, value);
            }
            prop_assert_eq!(has_media_type(&headers, media), model(&headers, media));
        }
    }

    /// The one pass reads what separate lookups read.
    fn looked_up(headers: &HeaderMap) -> RequestHeaders {
        let mut sessions = headers.get_all(&MCP_SESSION_ID).iter();
        RequestHeaders {
            session: sessions.next().cloned(),
            several_sessions: sessions.next().is_some(),
            odd_session: headers
                .get_all(&MCP_SESSION_ID)
                .iter()
                .any(|value| value.as_bytes().iter().any(|byte| !byte.is_ascii_graphic())),
            sessionless: headers
                .get(PROTOCOL_VERSION)
                .is_some_and(|version| is_sessionless_revision(version.as_bytes())),
            content_length: headers
                .get(CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse().ok()),
            encoded: headers.get_all(CONTENT_ENCODING).iter().any(|value| {
                value.to_str().map_or(true, |value| {
                    value
                        .split(',')
                        .map(|coding| coding.trim_matches([' ', '\t']))
                        .any(|coding| {
                            !coding.is_empty() && !coding.eq_ignore_ascii_case("identity")
                        })
                })
            }),
            method: headers.get(METHOD).map_or(McpMethod::Other, |method| {
                McpMethod::from_name(method.as_bytes())
            }),
            hides_decided_on: headers
                .get_all(http::header::CONNECTION)
                .iter()
                .any(|value| {
                    String::from_utf8_lossy(value.as_bytes())
                        .split(',')
                        .map(|token| token.trim_matches([' ', '\t']).to_ascii_lowercase())
                        .any(|token| DECIDED_ON.contains(&token.as_str()))
                }),
        }
    }

    /// `content_length` reads the bytes as `u64::from_str` reads the text,
    /// on the edges the proptest below seldom reaches (its values are ASCII).
    #[test]
    fn content_length_reads_as_the_standard_parser() {
        let max = u64::MAX.to_string();
        let over = format!("{max}0");
        let cases: [&[u8]; 17] = [
            b"",
            b"+",
            b"++1",
            b"+-1",
            b"-0",
            b"-1",
            b"0",
            b"007",
            b"+12",
            b"1 ",
            b" 1",
            b"1\xff",
            b"\xe91",
            b"1e3",
            b"0x10",
            max.as_bytes(),
            over.as_bytes(),
        ];
        for bytes in cases {
            let standard = std::str::from_utf8(bytes)
                .ok()
                .and_then(|text| text.parse::<u64>().ok());
            assert_eq!(content_length(bytes), standard, "{bytes:?}");
        }
    }

    proptest! {
        #[test]
        fn one_pass_reads_what_lookups_read(
            fields in proptest::collection::vec(
                (
                    prop_oneof![
                        Just("mcp-session-id"),
                        Just("mcp-protocol-version"),
                        Just("content-length"),
                        Just("content-encoding"),
                        Just("content-type"),
                        Just("mcp-method"),
                        Just("connection"),
                        Just("mcp-session"),
                        Just("x-other"),
                    ],
                    prop_oneof![
                        Just("s1".to_owned()),
                        Just("s2".to_owned()),
                        Just("s1 ".to_owned()),
                        Just("\ts2".to_owned()),
                        Just("s 1".to_owned()),
                        Just("2025-11-25".to_owned()),
                        Just("2026-07-28".to_owned()),
                        Just("identity".to_owned()),
                        Just(" Identity ".to_owned()),
                        Just("identity, IDENTITY".to_owned()),
                        Just(",".to_owned()),
                        Just("identity, gzip".to_owned()),
                        Just("gzip".to_owned()),
                        Just("tools/call".to_owned()),
                        Just("ping".to_owned()),
                        Just("12".to_owned()),
                        Just("keep-alive, MCP-Protocol-Version".to_owned()),
                        Just("close".to_owned()),
                        Just("Mcp-Session-Id,x-a".to_owned()),
                        Just(" host ".to_owned()),
                        Just("mcp-session".to_owned()),
                        Just("+12".to_owned()),
                        Just("99999999999999999999".to_owned()),
                        "[ -~]{0,6}",
                    ],
                ),
                0..8,
            )
        ) {
            let mut headers = HeaderMap::new();
            for (name, value) in &fields {
                if let Ok(value) = HeaderValue::from_str(value) {
                    headers.append(HeaderName::from_static(name), value);
                }
            }
            prop_assert_eq!(RequestHeaders::read(&headers), looked_up(&headers));
        }
    }

    #[test]
    fn media_types() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            headers
        };
        let json = "application/json";
        assert!(has_media_type(&with("application/json"), json));
        assert!(has_media_type(
            &with(" Application/JSON ; charset=utf-8"),
            json
        ));
        assert!(has_media_type(&with("application/json\t;"), json));
        assert!(!has_media_type(&with("application/json-seq"), json));
        assert!(!has_media_type(&with("text/event-stream"), json));
        assert!(!has_media_type(&HeaderMap::new(), json));
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_bytes(b"application/json; x=\xe9").unwrap(),
        );
        assert!(!has_media_type(&headers, json));
    }

    #[test]
    fn revisions() {
        assert!(is_sessionless_revision(b"2026-07-28"));
        assert!(is_sessionless_revision(b"2027-01-01"));
        assert!(!is_sessionless_revision(b"2025-06-18"));
        assert!(!is_sessionless_revision(b"draft"));
        assert!(!is_sessionless_revision(b"9999"));
    }
}
