//! The header edits on examples.

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
