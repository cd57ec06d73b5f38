//! What the upstream sees and what the client gets back: end-to-end headers
//! pass both ways, hop-by-hop headers are dropped both ways (RFC 9110
//! §7.6.1), `Host` is the upstream's, `X-Forwarded-*` are added, the upstream
//! path prefix is honoured, and bodies pass byte for byte.
use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcp_id_guard::IdGuardLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tower_layer::Layer as _;

use crate::support::server::{serve_proxy, serve_service, Served};
use crate::support::wait::drained;
use crate::support::OK_TIMEOUT;

/// One request as the upstream received it.
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) method: Method,
    pub(crate) version: http::Version,
    pub(crate) target: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// An upstream that reports every request it gets and answers with a mix of
/// end-to-end and hop-by-hop headers. Paths ending in `/missing` get 404,
/// DELETE gets 204.
pub(crate) async fn recording_upstream() -> anyhow::Result<(Served, mpsc::UnboundedReceiver<Seen>)>
{
    let (seen_tx, seen_rx) = mpsc::unbounded_channel();
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let seen_tx = seen_tx.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.map(|body| body.to_bytes());
            let status = if parts.uri.path().ends_with("/missing") {
                StatusCode::NOT_FOUND
            } else if parts.method == Method::DELETE {
                StatusCode::NO_CONTENT
            } else {
                StatusCode::OK
            };
            let _ = seen_tx.send(Seen {
                method: parts.method,
                version: parts.version,
                target: parts.uri.to_string(),
                headers: parts.headers,
                body: body.unwrap_or_default(),
            });
            let mut response = Response::builder()
                .status(status)
                .header("mcp-session-id", "from-upstream")
                .header("www-authenticate", r#"Bearer realm="mcp""#)
                .header("x-end-to-end", "yes")
                .header("connection", "x-upstream-hop")
                .header("x-upstream-hop", "1")
                .header("keep-alive", "timeout=5")
                .header("proxy-authenticate", "Basic")
                .header("trailer", "x-checksum");
            if status != StatusCode::NO_CONTENT {
                response = response.header("content-type", "application/json");
            }
            let body = if status == StatusCode::NO_CONTENT {
                Bytes::new()
            } else {
                Bytes::from_static(b"{}")
            };
            Ok::<_, Infallible>(response.body(Full::new(body)).unwrap())
        }
    });
    Ok((serve_service(service).await?, seen_rx))
}

pub(crate) async fn next_seen(seen: &mut mpsc::UnboundedReceiver<Seen>) -> anyhow::Result<Seen> {
    tokio::time::timeout(OK_TIMEOUT, seen.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("upstream gone"))
}

/// Sends raw bytes to `addr` and reads until the server closes; returns the
/// status code and the response headers.
pub(crate) async fn raw_exchange(
    addr: SocketAddr,
    request: &str,
) -> anyhow::Result<(u16, HeaderMap)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    tokio::time::timeout(OK_TIMEOUT, stream.read_to_end(&mut response)).await??;
    let text = String::from_utf8(response)?;
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status line in {text:?}"))?;
    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        headers.append(
            http::HeaderName::from_bytes(name.trim().as_bytes())?,
            value.trim().parse()?,
        );
    }
    Ok((status, headers))
}

pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Hop-by-hop headers are dropped in both directions; end-to-end headers
/// (`Authorization`, `Last-Event-ID`, `Mcp-Session-Id`, ...) pass; the
/// upstream sees its own `Host`, the `/prefix` of its base URL before the
/// client's path and query, and the `X-Forwarded-*` headers.
#[tokio::test]
async fn hop_by_hop_dropped_end_to_end_forwarded_prefix_honoured() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}/prefix", upstream.addr), &guard).await?;

    let request = [
        "GET /mcp?x=1 HTTP/1.1",
        "Host: guard.example:8080",
        "Connection: X-Custom, close",
        "X-Custom: secret-hop",
        "TE: trailers",
        "Keep-Alive: timeout=5",
        "Proxy-Connection: keep-alive",
        "Proxy-Authorization: Basic Zm9vOmJhcg==",
        "Upgrade: websocket",
        "Authorization: Bearer token-123",
        "Last-Event-ID: 42",
        "Mcp-Session-Id: sess-1",
        "MCP-Protocol-Version: 2025-06-18",
        "Accept: text/event-stream",
        "Origin: http://localhost:3000",
        "X-Forwarded-For: 203.0.113.7",
        "",
        "",
    ]
    .join("\r\n");
    let (status, response) = raw_exchange(proxy.addr, &request).await?;

    let seen = next_seen(&mut seen).await?;
    assert_eq!(seen.method, Method::GET);
    assert_eq!(seen.version, http::Version::HTTP_11);
    assert_eq!(seen.target, "/prefix/mcp?x=1");
    let headers = &seen.headers;
    for hop in [
        "x-custom",
        "te",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "upgrade",
    ] {
        assert!(
            !headers.contains_key(hop),
            "upstream saw {hop}: {headers:?}"
        );
    }
    assert!(
        !header(headers, "connection").is_some_and(|value| value.contains("X-Custom")),
        "{headers:?}"
    );
    for (name, value) in [
        ("host", upstream.addr.to_string().as_str()),
        ("authorization", "Bearer token-123"),
        ("last-event-id", "42"),
        ("mcp-session-id", "sess-1"),
        ("mcp-protocol-version", "2025-06-18"),
        ("accept", "text/event-stream"),
        ("origin", "http://localhost:3000"),
        // What the client claimed is replaced (see below).
        ("x-forwarded-for", "127.0.0.1"),
        ("x-forwarded-proto", "http"),
        ("x-forwarded-host", "guard.example:8080"),
    ] {
        assert_eq!(header(headers, name), Some(value), "{name} in {headers:?}");
    }

    assert_eq!(status, 200);
    for hop in [
        "x-upstream-hop",
        "keep-alive",
        "proxy-authenticate",
        "trailer",
    ] {
        assert!(
            !response.contains_key(hop),
            "client saw {hop}: {response:?}"
        );
    }
    assert!(!header(&response, "connection").is_some_and(|value| value.contains("x-upstream-hop")));
    assert_eq!(header(&response, "mcp-session-id"), Some("from-upstream"));
    assert_eq!(
        header(&response, "www-authenticate"),
        Some(r#"Bearer realm="mcp""#)
    );
    assert_eq!(header(&response, "x-end-to-end"), Some("yes"));
    assert_eq!(header(&response, "content-type"), Some("application/json"));
    Ok(())
}

/// The session id the upstream assigns reaches the client, and comes back to
/// the upstream on the next request; DELETE passes, and so do the upstream's
/// own statuses (204, 404).
#[tokio::test]
async fn session_id_round_trip_delete_and_upstream_statuses() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let client = reqwest::Client::new();
    let url = format!("http://{}/mcp", proxy.addr);

    let initialize = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;
    let response = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", crate::support::ACCEPT)
        .body(initialize)
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let session = response.headers()["mcp-session-id"].to_str()?.to_owned();
    assert_eq!(session, "from-upstream");
    let first = next_seen(&mut seen).await?;
    assert_eq!(first.body, initialize, "body passes byte for byte");
    assert_eq!(
        header(&first.headers, "content-length"),
        Some(initialize.len().to_string().as_str())
    );

    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let response = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", crate::support::ACCEPT)
        .header("mcp-session-id", &session)
        .body(call)
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let second = next_seen(&mut seen).await?;
    assert_eq!(
        header(&second.headers, "mcp-session-id"),
        Some("from-upstream")
    );
    assert_eq!(second.body, call);

    let response = client
        .delete(&url)
        .header("mcp-session-id", &session)
        .send()
        .await?;
    assert_eq!(response.status(), 204);
    let third = next_seen(&mut seen).await?;
    assert_eq!(third.method, Method::DELETE);
    assert_eq!(
        header(&third.headers, "mcp-session-id"),
        Some("from-upstream")
    );

    let response = client
        .get(format!("http://{}/mcp/missing", proxy.addr))
        .send()
        .await?;
    assert_eq!(response.status(), 404);
    assert_eq!(next_seen(&mut seen).await?.target, "/mcp/missing");
    drained(&guard).await?;
    Ok(())
}

/// A body of unknown length (chunked) that the guard does not read (no
/// session yet) streams through untouched, still chunked.
#[tokio::test]
async fn chunked_request_body_streams_through() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"{\"jsonrpc\":\"2.0\",")),
        Ok(Bytes::from_static(
            b"\"method\":\"notifications/initialized\"}",
        )),
    ];
    let response = reqwest::Client::new()
        .post(format!("http://{}/mcp", proxy.addr))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let seen = next_seen(&mut seen).await?;
    assert_eq!(
        seen.body,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
    );
    assert_eq!(
        header(&seen.headers, "transfer-encoding"),
        Some("chunked"),
        "{:?}",
        seen.headers
    );
    Ok(())
}

/// An HTTP/2 (h2c) client: the request reaches the upstream over HTTP/1.1
/// with the upstream's `Host`; the client's `:authority` is in
/// `X-Forwarded-Host`.
#[tokio::test]
async fn h2c_client_authority_becomes_x_forwarded_host() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let response = tokio::time::timeout(
        OK_TIMEOUT,
        client.request(
            Request::get(format!("http://{}/mcp?resume=1", proxy.addr))
                .header("last-event-id", "7")
                .header("authorization", "Bearer h2")
                .body(Empty::new())?,
        ),
    )
    .await??;
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["mcp-session-id"], "from-upstream");
    assert!(!response.headers().contains_key("x-upstream-hop"));
    let seen = next_seen(&mut seen).await?;
    assert_eq!(seen.version, http::Version::HTTP_11);
    assert_eq!(seen.target, "/mcp?resume=1");
    assert_eq!(
        header(&seen.headers, "host"),
        Some(upstream.addr.to_string().as_str())
    );
    assert_eq!(
        header(&seen.headers, "x-forwarded-host"),
        Some(proxy.addr.to_string().as_str())
    );
    assert_eq!(header(&seen.headers, "last-event-id"), Some("7"));
    assert_eq!(header(&seen.headers, "authorization"), Some("Bearer h2"));
    assert_eq!(header(&seen.headers, "x-forwarded-for"), Some("127.0.0.1"));
    Ok(())
}

/// An HTTP/2 client may send each cookie in a field of its own; the
/// HTTP/1.1 upstream gets them joined with `"; "` into one `Cookie` field
/// (RFC 9113 §8.2.3), not as separate lines of which servers read only the
/// first.
#[tokio::test]
async fn h2c_split_cookies_reach_the_upstream_as_one_field() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let request = Request::get(format!("http://{}/mcp", proxy.addr))
        .header("cookie", "session=s1")
        .header("cookie", "theme=dark")
        .header("cookie", "auth=a2; lang=en")
        .body(Empty::new())?;
    let response = tokio::time::timeout(OK_TIMEOUT, client.request(request)).await??;
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let seen = next_seen(&mut seen).await?;
    let cookies: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    assert_eq!(
        cookies,
        ["session=s1; theme=dark; auth=a2; lang=en"],
        "the upstream's Cookie fields"
    );
    Ok(())
}

/// The binary names each connection's client in `X-Forwarded-For` without a
/// request extension (its proxy is made for the connection): alone, or
/// after what earlier proxies put there with `--trust-forwarded`.
#[tokio::test]
async fn the_binary_names_the_client_in_x_forwarded_for() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = crate::support::process::Guard::start(&[
        "--upstream",
        &format!("http://{}", upstream.addr),
    ])
    .await?;
    let addr: SocketAddr = guard.addr.parse()?;
    let request = format!(
        "GET /mcp HTTP/1.1\r\nHost: {addr}\r\nX-Forwarded-For: 203.0.113.7\r\nConnection: close\r\n\r\n"
    );
    let (status, _) = raw_exchange(addr, &request).await?;
    assert_eq!(status, 200);
    let first = next_seen(&mut seen).await?;
    assert_eq!(header(&first.headers, "x-forwarded-for"), Some("127.0.0.1"));

    // Behind a trusted proxy, the chain goes on.
    let trusting = crate::support::process::Guard::start(&[
        "--upstream",
        &format!("http://{}", upstream.addr),
        "--trust-forwarded",
    ])
    .await?;
    let addr: SocketAddr = trusting.addr.parse()?;
    let request = format!(
        "GET /mcp HTTP/1.1\r\nHost: {addr}\r\nX-Forwarded-For: 203.0.113.7\r\nConnection: close\r\n\r\n"
    );
    let (status, _) = raw_exchange(addr, &request).await?;
    assert_eq!(status, 200);
    let seen = next_seen(&mut seen).await?;
    assert_eq!(
        header(&seen.headers, "x-forwarded-for"),
        Some("203.0.113.7, 127.0.0.1")
    );
    Ok(())
}

/// What a client claims about earlier hops, in every forwarding header.
const CLAIMED: [(&str, &str); 4] = [
    ("x-forwarded-for", "203.0.113.7"),
    ("x-forwarded-host", "admin.internal.example"),
    ("x-forwarded-proto", "https"),
    (
        "forwarded",
        "for=198.51.100.9;host=admin.internal.example;proto=https",
    ),
];

/// Sends `GET /mcp` to `proxy` with `Host: guard.example:8080` and the
/// [`CLAIMED`] forwarding headers; returns what the upstream saw.
async fn claimed_forwarding(
    proxy: SocketAddr,
    seen: &mut mpsc::UnboundedReceiver<Seen>,
) -> anyhow::Result<HeaderMap> {
    let mut request = String::from("GET /mcp HTTP/1.1\r\nHost: guard.example:8080\r\n");
    for (name, value) in CLAIMED {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    let (status, _) = raw_exchange(proxy, &request).await?;
    assert_eq!(status, 200);
    Ok(next_seen(seen).await?.headers)
}

/// Issue 30, item 7: by default the proxy is the first hop it trusts, so
/// what a client claims about earlier hops never reaches the upstream:
/// `X-Forwarded-For` is the client's address alone, `X-Forwarded-Host` the
/// `Host` it sent to the proxy, `X-Forwarded-Proto` `http`, and `Forwarded`
/// is dropped (they all went through unchanged, so an upstream that trusts
/// them saw whatever the client claimed).
#[tokio::test]
async fn client_forwarding_claims_are_overwritten_by_default() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let headers = claimed_forwarding(proxy.addr, &mut seen).await?;
    println!("the upstream saw {headers:?}");
    assert_eq!(header(&headers, "x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(
        header(&headers, "x-forwarded-host"),
        Some("guard.example:8080")
    );
    assert_eq!(header(&headers, "x-forwarded-proto"), Some("http"));
    assert!(!headers.contains_key("forwarded"), "{headers:?}");
    for name in ["x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"] {
        assert_eq!(headers.get_all(name).iter().count(), 1, "{name}");
    }
    Ok(())
}

/// Behind a proxy that sets them (a TLS terminator, a balancer),
/// `ProxyBuilder::trust_forwarded` keeps what it claims: `X-Forwarded-Host`,
/// `-Proto` and `Forwarded` pass and the client's address is appended to
/// `X-Forwarded-For` (nginx's `$proxy_add_x_forwarded_for`).
#[tokio::test]
async fn trusted_forwarding_claims_pass_for_chains() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = mcp_id_guard::proxy::Proxy::builder()
        .trust_forwarded(true)
        .build(&format!("http://{}", upstream.addr))?;
    let proxy = serve_service(guard.layer(proxy)).await?;
    let headers = claimed_forwarding(proxy.addr, &mut seen).await?;
    assert_eq!(
        header(&headers, "x-forwarded-for"),
        Some("203.0.113.7, 127.0.0.1")
    );
    for (name, value) in &CLAIMED[1..] {
        assert_eq!(header(&headers, name), Some(*value), "{name}");
    }
    Ok(())
}

/// An HTTP/2 client's `Mcp-Session-Id` with a space at its end is refused
/// at the proxy (400, `-32600`): HTTP/2 keeps the space, the HTTP/1.1
/// upstream's parser strips it, so the guard would track session `abc `
/// while the upstream routes into `abc`, and two `id: 1` of `abc` could be
/// in flight there together (found by review; before, this POST reached
/// the upstream as session `abc` with id 1, untracked as `abc`).
#[tokio::test]
async fn an_h2_session_id_with_a_space_at_its_end_is_refused() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}", upstream.addr), &guard).await?;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let request = Request::post(format!("http://{}/mcp", proxy.addr))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", "abc ")
        .body(Full::new(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
        )))?;
    let response = tokio::time::timeout(OK_TIMEOUT, client.request(request)).await??;
    assert_eq!(response.version(), http::Version::HTTP_2);
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let answer: serde_json::Value = serde_json::from_slice(&body)?;
    assert_eq!(
        (status, &answer["id"], &answer["error"]["code"]),
        (
            StatusCode::BAD_REQUEST,
            &serde_json::Value::Null,
            &serde_json::json!(-32600)
        ),
        "{answer}"
    );
    assert!(seen.try_recv().is_err(), "nothing reached the upstream");
    drained(&guard).await?;
    Ok(())
}
