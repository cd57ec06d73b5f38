//! The real rmcp server as the service the cost model measures the guard
//! against (`COUNT=<case>:<size>:rmcp-bare|rmcp-guarded:<n>`).
//!
//! `Fixed`, the inner service of the overhead cases, answers from a template
//! in about 3 300 instructions: it isolates the guard's own cost, but it is
//! no MCP server. This is one: rmcp 3.11's `StreamableHttpService` in its
//! default stateful mode, called in-process like `Fixed` (no sockets, so
//! callgrind counts the same things on both sides), with one tool, `echo`,
//! that reads the overhead cases' token-dense arguments and answers `ok`.
//! Its answer comes as an SSE event, as rmcp sends every answer to a POST.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use serde_json::Value;
use tower::{Service, ServiceExt};

/// The echo server.
#[derive(Clone)]
pub(crate) struct Echo {
    tool_router: ToolRouter<Self>,
}

/// The overhead cases' arguments (see `padding`): deserialized as a real
/// tool's would be, then dropped.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct Padding {
    #[serde(default)]
    #[allow(dead_code)]
    fill: String,
    #[serde(default)]
    #[allow(dead_code)]
    items: Vec<Value>,
}

#[tool_router]
impl Echo {
    /// Answers `ok`.
    #[tool(description = "Answers ok")]
    async fn echo(&self, Parameters(_padding): Parameters<Padding>) -> String {
        "ok".to_owned()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mcp-id-guard-bench", "0.0.0"))
    }
}

/// The rmcp service, as an axum or hyper server would hold it.
pub(crate) type Rmcp = StreamableHttpService<Echo, LocalSessionManager>;

/// A fresh rmcp service with rmcp's default (stateful) configuration.
pub(crate) fn service() -> Rmcp {
    let handler = Echo {
        tool_router: Echo::tool_router(),
    };
    StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    )
}

/// A POST to the endpoint as an MCP client sends it, with the `Host` rmcp's
/// DNS-rebinding check wants.
pub(crate) fn post(body: Bytes, session: Option<&str>) -> Request<Full<Bytes>> {
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = http::Uri::from_static("http://127.0.0.1/mcp");
    let headers = request.headers_mut();
    headers.insert(HOST, HeaderValue::from_static("127.0.0.1"));
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    headers.insert(
        "mcp-protocol-version",
        HeaderValue::from_static("2025-06-18"),
    );
    if let Some(session) = session {
        headers.insert(
            "mcp-session-id",
            HeaderValue::from_str(session).expect("a session id is a header value"),
        );
    }
    request
}

/// Calls `service` and reads the answer to its end: its head and body (the
/// overhead cases' `exchange` too).
pub(crate) async fn exchange<S, B>(
    service: &mut S,
    request: Request<Full<Bytes>>,
) -> (Response<()>, Bytes)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (Response::from_parts(parts, ()), body)
}

/// Opens a session on `service` (`initialize`, then `initialized`): its id.
pub(crate) async fn open<S, B>(service: &mut S) -> String
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let initialize = serde_json::json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": { "name": "mcp-id-guard-bench", "version": "0" }
        }
    });
    let (head, body) = exchange(service, post(Bytes::from(initialize.to_string()), None)).await;
    assert!(
        head.status().is_success(),
        "initialize: {} {body:?}",
        head.status()
    );
    let session = head
        .headers()
        .get("mcp-session-id")
        .expect("rmcp answers initialize with a session")
        .to_str()
        .expect("a session id is text")
        .to_owned();
    let initialized = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (head, body) = exchange(
        service,
        post(Bytes::from_static(initialized), Some(&session)),
    )
    .await;
    assert!(
        head.status().is_success(),
        "initialized: {} {body:?}",
        head.status()
    );
    session
}
