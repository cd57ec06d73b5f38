//! Hop-by-hop headers (RFC 9110 §7.6.1) and the `X-Forwarded-*` headers.

use std::net::IpAddr;

use http::header::{HeaderName, HeaderValue, CONNECTION, EXPECT, HOST, TE, TRAILER, UPGRADE};
use http::header::{PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TRANSFER_ENCODING};
use http::HeaderMap;

pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Removes the headers that describe one connection rather than the message:
/// `Connection` and every header it names, then the fixed list of RFC 9110
/// (and the pre-standard `Keep-Alive` and `Proxy-Connection`).
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none, or only `Transfer-Encoding`: one pass over
    // their names costs less than a hashed removal per hop-by-hop name.
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

/// The hop-by-hop headers of RFC 9110 (and the old `Keep-Alive` and
/// `Proxy-Connection`); the ones a `Connection` header names come on top.
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

/// Prepares a request's headers for the upstream: drops hop-by-hop headers
/// and `Expect` (this hop already answered it), sets `Host` to the upstream's
/// authority and adds the `X-Forwarded-*` headers.
///
/// `client_host` is the `Host` (or HTTP/2 `:authority`) the client sent;
/// with `preserve_host` it stays the `Host` (the upstream's authority is the
/// fallback when the client sent none).
pub(crate) fn prepare_request(
    headers: &mut HeaderMap,
    upstream_host: &HeaderValue,
    client_host: Option<HeaderValue>,
    client_ip: Option<IpAddr>,
    preserve_host: bool,
) {
    remove_hop_by_hop(headers);
    // The proxy's server already sent `100 Continue` (or not) when the body
    // was read; the upstream connection does not wait for one.
    headers.remove(EXPECT);
    let host = match (&client_host, preserve_host) {
        (Some(client_host), true) => client_host.clone(),
        _ => upstream_host.clone(),
    };
    headers.insert(HOST, host);
    if let Some(ip) = client_ip {
        append_forwarded_for(headers, ip);
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
    if !list.is_empty() {
        list.extend_from_slice(b", ");
    }
    list.extend_from_slice(ip.to_string().as_bytes());
    // Earlier values were valid header values and an IP address is ASCII.
    if let Ok(value) = HeaderValue::from_bytes(&list) {
        headers.insert(&X_FORWARDED_FOR, value);
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
        let mut headers = map(&[
            ("host", "guard.example:8080"),
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-for", "198.51.100.1"),
            ("expect", "100-continue"),
        ]);
        prepare_request(
            &mut headers,
            &upstream_host,
            Some(HeaderValue::from_static("guard.example:8080")),
            Some("127.0.0.1".parse().unwrap()),
            false,
        );
        assert_eq!(headers[HOST], "127.0.0.1:8000");
        assert_eq!(
            headers[&X_FORWARDED_FOR],
            "203.0.113.7, 198.51.100.1, 127.0.0.1"
        );
        assert_eq!(headers[&X_FORWARDED_PROTO], "http");
        assert_eq!(headers[&X_FORWARDED_HOST], "guard.example:8080");
        assert!(!headers.contains_key(EXPECT));

        // An earlier hop (a TLS terminator) knows the original scheme and host.
        let mut headers = map(&[
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "mcp.example.com"),
        ]);
        prepare_request(
            &mut headers,
            &upstream_host,
            Some(HeaderValue::from_static("10.0.0.5:8080")),
            None,
            false,
        );
        assert_eq!(headers[&X_FORWARDED_PROTO], "https");
        assert_eq!(headers[&X_FORWARDED_HOST], "mcp.example.com");
        assert!(!headers.contains_key(&X_FORWARDED_FOR));

        // Preserved: the upstream sees the client's Host (HTTP/2 clients'
        // `:authority` included); without one, its own authority.
        let mut headers = map(&[("host", "localhost:8080")]);
        let client_host = Some(HeaderValue::from_static("localhost:8080"));
        prepare_request(&mut headers, &upstream_host, client_host, None, true);
        assert_eq!(headers[HOST], "localhost:8080");
        let mut headers = HeaderMap::new();
        prepare_request(&mut headers, &upstream_host, None, None, true);
        assert_eq!(headers[HOST], "127.0.0.1:8000");
    }
}
