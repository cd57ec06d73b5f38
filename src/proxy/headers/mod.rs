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
mod tests;

/// The header edits as they were written first (a hashed removal per
/// hop-by-hop name, the client's host read up front, `X-Forwarded-For`
/// formatted with `to_string`): the model the single-pass versions above
/// must match exactly.
#[cfg(test)]
mod model;

#[cfg(test)]
mod matches_model;
