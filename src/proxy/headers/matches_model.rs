//! The single-pass header edits against [`super::model`], on generated
//! headers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{HeaderName, HeaderValue};
use http::uri::Authority;
use http::HeaderMap;
use proptest::prelude::*;

use super::{bit, ip_value, model, IpText, Seen, HOP_BY_HOP};

/// Names the edits care about, in several spellings, and some they do not.
const NAMES: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
    "expect",
    "host",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "forwarded",
    "accept",
    "content-type",
    "content-length",
    "mcp-session-id",
    "x-custom",
    "x-accel-buffering",
    "tf",
    "upgradf",
    "connectiom",
    "x-forwarded-fox",
    "proxy-connectiom",
    "trailers",
    "x-a-name-longer-than-sixty-four-bytes-which-http-looks-up-another-way-0123",
];

/// What a `Connection` header may name: names above in any case, lists,
/// blanks, and tokens that are no header name.
const TOKENS: &[&str] = &[
    "close",
    "keep-alive",
    "Keep-Alive",
    "upgrade",
    "HOST",
    "host",
    "X-Forwarded-For",
    "x-forwarded-proto",
    "X-FORWARDED-HOST",
    "Forwarded",
    "expect",
    "x-custom",
    "content-type",
    "mcp-session-id",
    " te ",
    "",
    " ",
    "a b",
    "\"quoted\"",
    "x-custom, close",
    ",,",
    "connection",
    "X-A-NAME-LONGER-THAN-SIXTY-FOUR-BYTES-WHICH-HTTP-LOOKS-UP-ANOTHER-WAY-0123",
];

const VALUES: &[&str] = &["v", "localhost:8080", "203.0.113.7", "https", "", "é"];

fn header() -> impl Strategy<Value = (HeaderName, HeaderValue)> {
    prop_oneof![
        (0..NAMES.len(), 0..VALUES.len()).prop_map(|(name, value)| (
            HeaderName::from_static(NAMES[name]),
            HeaderValue::from_bytes(VALUES[value].as_bytes()).unwrap(),
        )),
        (0..TOKENS.len()).prop_map(|token| (
            http::header::CONNECTION,
            HeaderValue::from_str(TOKENS[token]).unwrap(),
        )),
        // Not text: its tokens name nothing.
        Just((
            http::header::CONNECTION,
            HeaderValue::from_bytes("x-custom, \u{e9}".as_bytes()).unwrap(),
        )),
    ]
}

fn ip() -> impl Strategy<Value = Option<IpAddr>> {
    prop_oneof![
        Just(None),
        any::<[u8; 4]>().prop_map(|octets| Some(IpAddr::V4(Ipv4Addr::from(octets)))),
        any::<[u16; 8]>().prop_map(|segments| Some(IpAddr::V6(Ipv6Addr::from(segments)))),
        Just(Some(IpAddr::V6(Ipv6Addr::LOCALHOST))),
        Just(Some(IpAddr::V6(
            Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped()
        ))),
    ]
}

fn map(pairs: &[(HeaderName, HeaderValue)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(name.clone(), value.clone());
    }
    headers
}

/// Every name and value, in the order they would go on the wire.
fn listed(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn hop_by_hop_removal(pairs in prop::collection::vec(header(), 0..12)) {
        let mut fast = map(&pairs);
        let mut slow = map(&pairs);
        super::remove_hop_by_hop(&mut fast);
        model::remove_hop_by_hop(&mut slow);
        prop_assert_eq!(listed(&fast), listed(&slow));
    }

    #[test]
    fn request_preparation(
        pairs in prop::collection::vec(header(), 0..12),
        ip in ip(),
        authority in prop::option::of(prop_oneof![Just("10.0.0.5:8080"), Just("h2.example")]),
        preserve_host: bool,
        trust_forwarded: bool,
    ) {
        let upstream_host = HeaderValue::from_static("127.0.0.1:8000");
        let authority: Option<Authority> = authority.map(|text| text.parse().unwrap());
        let mut fast = map(&pairs);
        let mut slow = map(&pairs);
        super::prepare_request(
            &mut fast, &upstream_host, authority.as_ref(), ip, preserve_host, trust_forwarded,
        );
        model::prepare_request(
            &mut slow, &upstream_host, authority.as_ref(), ip, preserve_host, trust_forwarded,
        );
        prop_assert_eq!(listed(&fast), listed(&slow));
    }

    #[test]
    fn ip_text(ip in ip()) {
        if let Some(ip) = ip {
            let text = IpText::of(ip);
            let written = ip.to_string();
            prop_assert_eq!(text.as_bytes(), written.as_bytes());
        }
    }
}

#[test]
fn the_kept_address_is_the_one_asked_for() {
    let a = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let b = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let c = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    for ip in [a, a, b, b, a, c, a, c, c] {
        assert_eq!(ip_value(ip), ip.to_string().as_str());
    }
}

#[test]
fn every_name_has_its_own_bit() {
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        assert_eq!(bit(name.as_str()), 1 << index, "{name}");
    }
    let mut headers = HeaderMap::new();
    for name in NAMES {
        headers.append(HeaderName::from_static(name), HeaderValue::from_static("v"));
    }
    // 9 hop-by-hop names, `expect`, the three `x-forwarded-*` and
    // `forwarded`.
    assert_eq!(Seen::scan(&headers).0.count_ones(), 14);
    for octets in [
        [0, 0, 0, 0],
        [9, 10, 99, 100],
        [255, 255, 255, 255],
        [1, 20, 200, 7],
    ] {
        let ip = IpAddr::V4(Ipv4Addr::from(octets));
        assert_eq!(IpText::of(ip).as_bytes(), ip.to_string().as_bytes());
    }
}
