//! The stack a real axum 0.8 + rmcp 3.11 + tower-http 0.6 or 0.7 application runs,
//! in the order the crate docs recommend ("Where to put other layers"), with
//! an rmcp server whose one tool is slow.
//!
//! ```text
//! cargo run --example full_stack           # then point an MCP client at http://127.0.0.1:8000/mcp
//! ```
//!
//! `PORT` changes the port, `RUST_LOG=tower_http=debug` shows the trace
//! layer's spans. Stop it with Ctrl-C.
//!
//! From the outside in (each layer sees a request before the ones below it):
//!
//! | layer | why there |
//! |---|---|
//! | `TraceLayer` | sees every request and how it ended, the stack's own refusals included |
//! | `ResponseBodyTimeoutLayer` | what cuts a slow tool: rmcp answers every POST of a session as SSE with its headers at once, so only the body can time out. Outside `CompressionLayer`, `CorsLayer` and `TimeoutLayer`: those build responses with `Default`, which its `TimeoutBody` lacks (the stack would not build) |
//! | `CompressionLayer` | outside the guard, which restores ids in the server's uncompressed bytes; told to compress `text/event-stream`, which its default predicate skips (every rmcp answer is SSE). It flushes whenever the server pauses, so each event still arrives as it is sent |
//! | `CorsLayer` | answers browser preflights (`OPTIONS`) itself; the POST that follows still meets `HostLayer`, which refuses a foreign `Origin` with `403` whatever CORS allowed: allow only origins `HostLayer` allows |
//! | `TimeoutLayer` | bounds the wait for response headers (a request queued under `OnDuplicate::Queue`, a server slow to start its stream); its `408` has no body. Keep `max_queue_wait` below it |
//! | `ProtectLayer` | the network protections (`HeadLimitLayer`, `HostLayer`, `BodyPaceLayer`), cheapest first, so a request they refuse is never read |
//! | `IdGuardLayer` | innermost: it must see every POST of a session just before the server does |
//!
//! `tests/rmcp/full_stack.rs` runs this very stack (it includes this file):
//! the burst of twelve same-id calls, a tool cut by the body timeout and its
//! id reused, compression per event, CORS and the queue's timeout.

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};

// README.md shows from the next line to the end marker ("Where to put other
// layers"); src/lib.rs's tests check that it is this text.
use http::{header, HeaderName, HeaderValue, Method, StatusCode};
use mcp_id_guard::protect::head::HeadLimitLayer;
use mcp_id_guard::protect::host::HostPolicy;
use mcp_id_guard::protect::ProtectLayer;
use mcp_id_guard::IdGuardLayer;
use tower::ServiceBuilder;
use tower_http::compression::predicate::{NotForContentType, Predicate, SizeAbove};
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::{ResponseBodyTimeoutLayer, TimeoutLayer};
use tower_http::trace::TraceLayer;

/// The browser origin allowed by CORS (the MCP Inspector's default), one
/// that `HostPolicy::loopback()` allows too: CORS cannot widen what
/// `HostLayer` refuses.
pub const BROWSER_ORIGIN: &str = "http://localhost:6274";

/// The whole application: the MCP service at `/mcp` behind the stack.
pub fn app(guard: IdGuardLayer, timeouts: Timeouts) -> axum::Router {
    // tower-http's default predicate skips `text/event-stream`, which is
    // every answer rmcp gives in a session: without this, compression
    // compresses nothing.
    let compress_sse_too = SizeAbove::default()
        .and(NotForContentType::GRPC)
        .and(NotForContentType::IMAGES);
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::exact(HeaderValue::from_static(BROWSER_ORIGIN)))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::CONTENT_TYPE,
            header::AUTHORIZATION,
            HeaderName::from_static("mcp-session-id"),
            HeaderName::from_static("mcp-protocol-version"),
            HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([HeaderName::from_static("mcp-session-id")]);

    let stack = ServiceBuilder::new()
        .layer(TraceLayer::new_for_http())
        .layer(ResponseBodyTimeoutLayer::new(timeouts.response_body_idle))
        .layer(CompressionLayer::new().compress_when(compress_sse_too))
        .layer(cors)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeouts.response_head,
        ))
        // 431 over 16 KiB of head, 421 / 403 for DNS rebinding, 408 for a
        // body that pauses 30 s or sends < 240 B/s after 5 s: in this order.
        .layer(ProtectLayer::new(HostPolicy::loopback()).head_limit(HeadLimitLayer::new(16 * 1024)))
        .layer(guard);
    axum::Router::new()
        .nest_service("/mcp", mcp_service(timeouts))
        .layer(stack)
}
// README.md's copy ends here.

/// Arguments of the `slow_echo` tool.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct SlowEchoArgs {
    /// Text to send back.
    pub text: String,
    /// How long to work first, in milliseconds.
    pub ms: u64,
}

/// A server with one slow tool. rmcp builds one per session.
#[derive(Clone)]
pub struct SlowServer {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl SlowServer {
    #[tool(description = "Wait `ms` milliseconds, then send the text back")]
    async fn slow_echo(&self, Parameters(args): Parameters<SlowEchoArgs>) -> String {
        tokio::time::sleep(Duration::from_millis(args.ms)).await;
        args.text
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SlowServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("full-stack-slow", "0.0.0"))
    }
}

/// The stack's time limits.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// `TimeoutLayer`: the longest wait for response headers (`408`).
    pub response_head: Duration,
    /// `ResponseBodyTimeoutLayer`: the longest silence in a response body,
    /// after which the stream is cut. A silence, not a total: every frame
    /// restarts it, rmcp's SSE keep-alive comments included.
    pub response_body_idle: Duration,
    /// rmcp's SSE keep-alive comment interval (`None`: none). A keep-alive
    /// shorter than `response_body_idle` keeps every stream alive, so the
    /// body timeout could never cut a slow tool.
    pub sse_keep_alive: Option<Duration>,
}

impl Timeouts {
    /// What `main` runs with: a tool call may stay silent for 2 minutes;
    /// keep-alive comments every 3 minutes, so they do not hide that silence
    /// (an idle standalone `GET` stream is cut too, and clients reopen it).
    pub const PRODUCTION: Self = Self {
        response_head: Duration::from_secs(60),
        response_body_idle: Duration::from_secs(120),
        sse_keep_alive: Some(Duration::from_secs(180)),
    };
}

/// The rmcp MCP service: stateful streamable HTTP, which routes responses
/// by request id alone (the bug the guard fixes).
pub fn mcp_service(timeouts: Timeouts) -> StreamableHttpService<SlowServer, LocalSessionManager> {
    StreamableHttpService::new(
        || {
            Ok(SlowServer {
                tool_router: SlowServer::tool_router(),
            })
        },
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_sse_keep_alive(timeouts.sse_keep_alive),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    let guard = IdGuardLayer::new(); // OnDuplicate::Remap
    let app = app(guard.clone(), Timeouts::PRODUCTION);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|port| port.parse().ok())
        .unwrap_or(8000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("MCP server on http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    println!("{:?}", guard.stats());
    Ok(())
}
