//! Requests the proxy answers itself because of their method: `TRACE` and
//! `CONNECT` get `405` with `Allow`, `OPTIONS *` gets `200` with `Allow`,
//! and none of them reaches the upstream; `OPTIONS` for a path (a CORS
//! preflight) still does.

use mcp_id_guard::IdGuardLayer;

use crate::headers::{header, next_seen, raw_exchange, recording_upstream};
use crate::support::server::serve_proxy;

/// The methods the proxy's `Allow` names.
const ALLOWED: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// `TRACE` (which would have the upstream echo the headers the proxy adds)
/// and `CONNECT` (a tunnel) are answered `405` with `Allow`; the upstream's
/// next request is the `GET` sent after them.
#[tokio::test]
async fn trace_and_connect_get_405_without_reaching_the_upstream() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}/prefix", upstream.addr), &guard).await?;
    let addr = proxy.addr;
    for request in [
        format!("TRACE /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        format!("CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    ] {
        let (status, headers) = raw_exchange(addr, &request).await?;
        assert_eq!(status, 405, "{request:?}");
        assert_eq!(header(&headers, "allow"), Some(ALLOWED), "{request:?}");
        assert_eq!(
            header(&headers, "content-type"),
            Some("application/json"),
            "a JSON-RPC error"
        );
    }
    let get = format!("GET /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    assert_eq!(raw_exchange(addr, &get).await?.0, 200);
    let first = next_seen(&mut seen).await?;
    assert_eq!(
        (first.method.as_str(), first.target.as_str()),
        ("GET", "/prefix/mcp"),
        "the upstream's first request"
    );
    Ok(())
}

/// `OPTIONS *` asks about the server in general: the proxy answers it
/// (`200`, `Allow`) rather than forwarding it as `OPTIONS /prefix/*`, a
/// request for a resource named `*`. `OPTIONS /mcp` is forwarded.
#[tokio::test]
async fn options_asterisk_is_answered_by_the_proxy() -> anyhow::Result<()> {
    let (upstream, mut seen) = recording_upstream().await?;
    let guard = IdGuardLayer::new();
    let proxy = serve_proxy(&format!("http://{}/prefix", upstream.addr), &guard).await?;
    let addr = proxy.addr;
    let asterisk = format!("OPTIONS * HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let (status, headers) = raw_exchange(addr, &asterisk).await?;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "allow"), Some(ALLOWED));
    assert_eq!(header(&headers, "content-length"), Some("0"));
    let path = format!("OPTIONS /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    assert_eq!(raw_exchange(addr, &path).await?.0, 200);
    let first = next_seen(&mut seen).await?;
    assert_eq!(
        (first.method.as_str(), first.target.as_str()),
        ("OPTIONS", "/prefix/mcp"),
        "the upstream's first request"
    );
    Ok(())
}
