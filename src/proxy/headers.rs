//! Hop-by-hop headers (RFC 9110 §7.6.1) and the forwarding headers
//! (`X-Forwarded-*`, RFC 7239 `Forwarded`).
//!
//! Unless the proxy is told to trust the hop in front of it, what a client
//! claims about earlier hops never reaches the upstream: the proxy is then
//! the first hop the upstream can believe (Envoy's `use_remote_address` with
//! no trusted hops; nginx's `proxy_set_header X-Forwarded-For $remote_addr`),
//! so `X-Forwarded-For` is the client's address alone, `X-Forwarded-Host`
//! the host the client named, `X-Forwarded-Proto` `http`, and `Forwarded`
//! goes. Trusted (behind a TLS terminator or balancer that sets them), they
//! pass and the client's address is appended to `X-Forwarded-For` (nginx's
//! `$proxy_add_x_forwarded_for`).

use std::cell::Cell;
use std::net::IpAddr;

use http::header::{
    HeaderName, HeaderValue, CONNECTION, EXPECT, FORWARDED, HOST, TE, TRAILER, UPGRADE,
};
use http::header::{PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TRANSFER_ENCODING};
use http::uri::Authority;
use http::HeaderMap;

pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Removes the headers that describe one connection rather than the message:
/// `Connection` and every header it names, then the fixed list of RFC 9110
/// (and the pre-standard `Keep-Alive` and `Proxy-Connection`).
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap) {
    remove_seen_hop_by_hop(headers, Seen::scan(headers));
}

/// [`remove_hop_by_hop`] once the names are known: removing only the fixed
/// names that are there leaves the map as removing every one of them would
/// (in the same order), at one hashed lookup per name present instead of
/// one per name of the list.
fn remove_seen_hop_by_hop(headers: &mut HeaderMap, seen: Seen) {
    if seen.0 & HOP_BY_HOP_BITS == 0 {
        return;
    }
    if seen.has(CONNECTION_BIT) {
        // Owned copies (reference counted, not copied) of the values, since
        // the map changes while their tokens are read.
        let mut values = headers.get_all(CONNECTION).iter();
        let first = values.next().cloned();
        let rest: Vec<HeaderValue> = values.cloned().collect();
        for value in first.iter().chain(&rest) {
            let Ok(value) = value.to_str() else { continue };
            for token in value.split(',') {
                // A name given as text is looked up without allocating; one
                // that is not a valid header name names nothing, as it did
                // when it was parsed into a `HeaderName` first.
                headers.remove(token.trim());
            }
        }
    }
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        if seen.has(1 << index) {
            headers.remove(name);
        }
    }
}

/// The hop-by-hop headers of RFC 9110 (and the old `Keep-Alive` and
/// `Proxy-Connection`); the ones a `Connection` header names come on top.
/// Bit `i` of [`Seen`] stands for `HOP_BY_HOP[i]`.
static HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
];

const CONNECTION_BIT: u16 = 1;
const HOP_BY_HOP_BITS: u16 = (1 << HOP_BY_HOP.len()) - 1;
const EXPECT_BIT: u16 = 1 << 9;
const FORWARDED_FOR_BIT: u16 = 1 << 10;
const FORWARDED_PROTO_BIT: u16 = 1 << 11;
const FORWARDED_HOST_BIT: u16 = 1 << 12;
const FORWARDED_BIT: u16 = 1 << 13;

/// Which of the names the proxy removes or adds a message carries, found in
/// one pass over its names instead of one hashed lookup per name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen(u16);

impl Seen {
    fn scan(headers: &HeaderMap) -> Self {
        Self(
            headers
                .keys()
                .fold(0, |seen, name| seen | bit(name.as_str())),
        )
    }

    fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }
}

/// The bit of [`Seen`] for a (lower-case) header name; 0 for the others. The
/// length and first byte leave one candidate to compare.
fn bit(name: &str) -> u16 {
    let bytes = name.as_bytes();
    let (candidate, bit) = match (bytes.len(), bytes.first()) {
        (2, _) => ("te", 1 << 3),
        (6, _) => ("expect", EXPECT_BIT),
        (7, Some(b't')) => ("trailer", 1 << 4),
        (7, _) => ("upgrade", 1 << 6),
        (9, _) => ("forwarded", FORWARDED_BIT),
        (10, Some(b'c')) => ("connection", CONNECTION_BIT),
        (10, _) => ("keep-alive", 1 << 1),
        (15, _) => ("x-forwarded-for", FORWARDED_FOR_BIT),
        (16, Some(b'p')) => ("proxy-connection", 1 << 2),
        (16, _) => ("x-forwarded-host", FORWARDED_HOST_BIT),
        (17, Some(b't')) => ("transfer-encoding", 1 << 5),
        (17, _) => ("x-forwarded-proto", FORWARDED_PROTO_BIT),
        (18, _) => ("proxy-authenticate", 1 << 7),
        (19, _) => ("proxy-authorization", 1 << 8),
        _ => return 0,
    };
    if name == candidate {
        bit
    } else {
        0
    }
}

/// Prepares a request's headers for the upstream: drops hop-by-hop headers
/// and `Expect` (this hop already answered it), sets `Host` to the upstream's
/// authority and sets the forwarding headers (see the [module docs](self);
/// `trust_forwarded` keeps what the client sent).
///
/// The client's host is its `Host` header, else the request target's
/// `authority` (HTTP/2 `:authority`); with `preserve_host` it stays the
/// `Host` (the upstream's authority is the fallback when the client sent
/// none).
pub(crate) fn prepare_request(
    headers: &mut HeaderMap,
    upstream_host: &HeaderValue,
    authority: Option<&Authority>,
    client_ip: Option<IpAddr>,
    preserve_host: bool,
    trust_forwarded: bool,
) {
    let seen = Seen::scan(headers);
    // Headers named in `Connection` go before `Host` is set (even `Host`
    // itself), so the client's host is read before they go.
    let named = seen.has(CONNECTION_BIT);
    let read_first = (named || preserve_host).then(|| headers.get(HOST).cloned());
    remove_seen_hop_by_hop(headers, seen);
    // The proxy's server already sent `100 Continue` (or not) when the body
    // was read; the upstream connection does not wait for one.
    if seen.has(EXPECT_BIT) {
        headers.remove(EXPECT);
    }
    let client_host = match read_first {
        Some(client_host) => {
            let client_host = client_host.or_else(|| authority_value(authority));
            let host = match (&client_host, preserve_host) {
                (Some(client_host), true) => client_host.clone(),
                _ => upstream_host.clone(),
            };
            headers.insert(HOST, host);
            client_host
        }
        // Only fixed names went, so `Host` is still the client's: the value
        // `insert` replaces (the first) is the one `get` would have given.
        None => headers
            .insert(HOST, upstream_host.clone())
            .or_else(|| authority_value(authority)),
    };
    if !trust_forwarded {
        set_forwarded(headers, seen, client_ip, client_host);
        return;
    }
    // A name that was not there is not there now; one that was may have
    // been named in `Connection`.
    let present = |headers: &HeaderMap, bit: u16, name: &HeaderName| {
        seen.has(bit) && (!named || headers.contains_key(name))
    };
    if let Some(ip) = client_ip {
        if seen.has(FORWARDED_FOR_BIT) {
            append_forwarded_for(headers, ip);
        } else {
            headers.insert(&X_FORWARDED_FOR, ip_value(ip));
        }
    }
    if !present(headers, FORWARDED_PROTO_BIT, &X_FORWARDED_PROTO) {
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if let Some(client_host) = client_host {
        if !present(headers, FORWARDED_HOST_BIT, &X_FORWARDED_HOST) {
            headers.insert(&X_FORWARDED_HOST, client_host);
        }
    }
}

/// The forwarding headers when the proxy is the first trusted hop: each the
/// proxy's own observation, whatever the client sent (`seen` tells which
/// names it sent, so the common request without them costs no lookups).
fn set_forwarded(
    headers: &mut HeaderMap,
    seen: Seen,
    client_ip: Option<IpAddr>,
    client_host: Option<HeaderValue>,
) {
    if seen.has(FORWARDED_BIT) {
        headers.remove(FORWARDED);
    }
    match client_ip {
        Some(ip) => {
            headers.insert(&X_FORWARDED_FOR, ip_value(ip));
        }
        None if seen.has(FORWARDED_FOR_BIT) => {
            headers.remove(&X_FORWARDED_FOR);
        }
        None => {}
    }
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    match client_host {
        Some(client_host) => {
            headers.insert(&X_FORWARDED_HOST, client_host);
        }
        None if seen.has(FORWARDED_HOST_BIT) => {
            headers.remove(&X_FORWARDED_HOST);
        }
        None => {}
    }
}

/// The request target's authority as a `Host` value.
fn authority_value(authority: Option<&Authority>) -> Option<HeaderValue> {
    authority.and_then(|authority| HeaderValue::from_str(authority.as_str()).ok())
}

/// Appends the client's address to `X-Forwarded-For`, folding earlier values
/// into one comma-separated list.
fn append_forwarded_for(headers: &mut HeaderMap, ip: IpAddr) {
    let mut list: Vec<u8> = Vec::new();
    for value in headers.get_all(&X_FORWARDED_FOR) {
        if !list.is_empty() {
            list.extend_from_slice(b", ");
        }
        list.extend_from_slice(value.as_bytes());
    }
    if list.is_empty() {
        headers.insert(&X_FORWARDED_FOR, ip_value(ip));
        return;
    }
    list.extend_from_slice(b", ");
    list.extend_from_slice(IpText::of(ip).as_bytes());
    // Earlier values were valid header values and an IP address is ASCII.
    if let Ok(value) = HeaderValue::from_bytes(&list) {
        headers.insert(&X_FORWARDED_FOR, value);
    }
}

/// An address as a header value, as `ip.to_string()` spells it.
///
/// Consecutive requests on a thread mostly come from one client (on
/// loopback, always), so the last value written is kept per thread and
/// shared (a reference count) instead of written and allocated again.
fn ip_value(ip: IpAddr) -> HeaderValue {
    thread_local! {
        static LAST: Cell<Option<(IpAddr, HeaderValue)>> = const { Cell::new(None) };
    }
    let write = |ip: IpAddr| {
        HeaderValue::from_bytes(IpText::of(ip).as_bytes())
            .expect("an IP address is written in ASCII digits, letters, '.' and ':'")
    };
    LAST.try_with(|last| {
        let value = match last.take() {
            Some((cached, value)) if cached == ip => value,
            _ => write(ip),
        };
        last.set(Some((ip, value.clone())));
        value
    })
    // The thread is ending.
    .unwrap_or_else(|_| write(ip))
}

/// An IP address written out on the stack, as its `Display` writes it: the
/// formatting machinery costs more than a whole proxied request's header
/// edits for an IPv4 address, so those are written digit by digit.
struct IpText {
    bytes: [u8; 64],
    len: usize,
}

impl IpText {
    fn of(ip: IpAddr) -> Self {
        let mut text = Self {
            bytes: [0; 64],
            len: 0,
        };
        match ip {
            IpAddr::V4(ip) => {
                for (index, octet) in ip.octets().into_iter().enumerate() {
                    if index > 0 {
                        text.push(b'.');
                    }
                    if octet >= 100 {
                        text.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        text.push(b'0' + octet / 10 % 10);
                    }
                    text.push(b'0' + octet % 10);
                }
            }
            // At most 45 characters: it fits.
            IpAddr::V6(ip) => {
                use std::fmt::Write;
                write!(text, "{ip}").expect("an IPv6 address fits in 64 bytes");
            }
        }
        text
    }

    fn push(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        let end = self.len + text.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(std::fmt::Error)?
            .copy_from_slice(text.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn drops_connection_and_the_headers_it_names() {
        let mut headers = map(&[
            ("connection", "X-Custom, close"),
            ("connection", "x-other"),
            ("x-custom", "1"),
            ("x-other", "2"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authenticate", "Basic"),
            ("proxy-authorization", "Basic eA=="),
            ("authorization", "Bearer t"),
            ("mcp-session-id", "s"),
            ("last-event-id", "7"),
        ]);
        remove_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "last-event-id", "mcp-session-id"]);
    }

    #[test]
    fn forwarded_headers() {
        let upstream_host = HeaderValue::from_static("127.0.0.1:8000");
        let client = || {
            map(&[
                ("host", "guard.example:8080"),
                ("x-forwarded-for", "203.0.113.7"),
                ("x-forwarded-for", "198.51.100.1"),
                ("forwarded", "for=198.51.100.9"),
                ("expect", "100-continue"),
            ])
        };
        let ip = Some("127.0.0.1".parse().unwrap());
        // Trusted: the chain goes on.
        let mut headers = client();
        prepare_request(&mut headers, &upstream_host, None, ip, false, true);
        assert_eq!(headers[HOST], "127.0.0.1:8000");
        assert_eq!(
            headers[&X_FORWARDED_FOR],
            "203.0.113.7, 198.51.100.1, 127.0.0.1"
        );
        assert_eq!(headers[&X_FORWARDED_PROTO], "http");
        assert_eq!(headers[&X_FORWARDED_HOST], "guard.example:8080");
        assert_eq!(headers[FORWARDED], "for=198.51.100.9");
        assert!(!headers.contains_key(EXPECT));
        // Not trusted: only what the proxy saw.
        let mut headers = client();
        prepare_request(&mut headers, &upstream_host, None, ip, false, false);
        assert_eq!(headers[&X_FORWARDED_FOR], "127.0.0.1");
        assert_eq!(headers.get_all(&X_FORWARDED_FOR).iter().count(), 1);
        assert!(!headers.contains_key(FORWARDED));
        assert!(!headers.contains_key(EXPECT));

        // An earlier hop (a TLS terminator) knows the original scheme and
        // host: kept when trusted, replaced when not.
        let claimed = || {
            map(&[
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "mcp.example.com"),
                ("x-forwarded-for", "203.0.113.7"),
            ])
        };
        let authority: Authority = "10.0.0.5:8080".parse().unwrap();
        let mut headers = claimed();
        prepare_request(
            &mut headers,
            &upstream_host,
            Some(&authority),
            None,
            false,
            true,
        );
        assert_eq!(headers[&X_FORWARDED_PROTO], "https");
        assert_eq!(headers[&X_FORWARDED_HOST], "mcp.example.com");
        assert_eq!(headers[&X_FORWARDED_FOR], "203.0.113.7");
        let mut headers = claimed();
        prepare_request(
            &mut headers,
            &upstream_host,
            Some(&authority),
            None,
            false,
            false,
        );
        assert_eq!(headers[&X_FORWARDED_PROTO], "http");
        assert_eq!(headers[&X_FORWARDED_HOST], "10.0.0.5:8080");
        assert!(
            !headers.contains_key(&X_FORWARDED_FOR),
            "no address to give"
        );
        let mut headers = claimed();
        prepare_request(&mut headers, &upstream_host, None, None, false, false);
        assert!(!headers.contains_key(&X_FORWARDED_HOST), "no host to give");

        // Preserved: the upstream sees the client's Host (HTTP/2 clients'
        // `:authority` included); without one, its own authority.
        let mut headers = map(&[("host", "localhost:8080")]);
        prepare_request(&mut headers, &upstream_host, None, None, true, false);
        assert_eq!(headers[HOST], "localhost:8080");
        let mut headers = HeaderMap::new();
        prepare_request(&mut headers, &upstream_host, None, None, true, false);
        assert_eq!(headers[HOST], "127.0.0.1:8000");
    }
}

/// The header edits as they were written first (a hashed removal per
/// hop-by-hop name, the client's host read up front, `X-Forwarded-For`
/// formatted with `to_string`): the model the single-pass versions above
/// must match exactly.
#[cfg(test)]
mod model {
    use std::net::IpAddr;

    use http::header::{HeaderName, HeaderValue, CONNECTION, EXPECT, FORWARDED, HOST};
    use http::uri::Authority;
    use http::HeaderMap;

    use super::{HOP_BY_HOP, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};

    pub(super) fn remove_hop_by_hop(headers: &mut HeaderMap) {
        if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
            return;
        }
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
        for name in &HOP_BY_HOP {
            headers.remove(name);
        }
    }

    pub(super) fn prepare_request(
        headers: &mut HeaderMap,
        upstream_host: &HeaderValue,
        authority: Option<&Authority>,
        client_ip: Option<IpAddr>,
        preserve_host: bool,
        trust_forwarded: bool,
    ) {
        let client_host = headers.get(HOST).cloned().or_else(|| {
            authority.and_then(|authority| HeaderValue::from_str(authority.as_str()).ok())
        });
        remove_hop_by_hop(headers);
        headers.remove(EXPECT);
        let host = match (&client_host, preserve_host) {
            (Some(client_host), true) => client_host.clone(),
            _ => upstream_host.clone(),
        };
        headers.insert(HOST, host);
        if !trust_forwarded {
            headers.remove(FORWARDED);
            match client_ip {
                Some(ip) => {
                    headers.insert(&X_FORWARDED_FOR, ip.to_string().parse().unwrap());
                }
                None => {
                    headers.remove(&X_FORWARDED_FOR);
                }
            }
            headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
            match client_host {
                Some(client_host) => {
                    headers.insert(&X_FORWARDED_HOST, client_host);
                }
                None => {
                    headers.remove(&X_FORWARDED_HOST);
                }
            }
            return;
        }
        if let Some(ip) = client_ip {
            let mut list: Vec<u8> = Vec::new();
            for value in headers.get_all(&X_FORWARDED_FOR) {
                if !list.is_empty() {
                    list.extend_from_slice(b", ");
                }
                list.extend_from_slice(value.as_bytes());
            }
            if !list.is_empty() {
                list.extend_from_slice(b", ");
            }
            list.extend_from_slice(ip.to_string().as_bytes());
            if let Ok(value) = HeaderValue::from_bytes(&list) {
                headers.insert(&X_FORWARDED_FOR, value);
            }
        }
        if !headers.contains_key(&X_FORWARDED_PROTO) {
            headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        }
        if let Some(client_host) = client_host {
            if !headers.contains_key(&X_FORWARDED_HOST) {
                headers.insert(&X_FORWARDED_HOST, client_host);
            }
        }
    }
}

#[cfg(test)]
mod matches_model {
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
}
