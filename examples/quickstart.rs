//! The README's quick start as a whole program: an rmcp 3.11 MCP server with
//! one tool, served by axum on loopback, behind the network protections and
//! the id guard.
//!
//! ```text
//! cargo run --example quickstart            # then point an MCP client at http://127.0.0.1:8000/mcp
//! ```
//!
//! `PORT` changes the port. Stop it with Ctrl-C.

use std::sync::Arc;

use mcp_id_guard::protect::{BodyPaceLayer, HeadLimitLayer, HostLayer, HostPolicy};
use mcp_id_guard::IdGuardLayer;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use tower::ServiceBuilder;

/// Arguments of the `echo` tool.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    text: String,
}

/// A server with one tool. rmcp builds one per session.
#[derive(Clone)]
struct Echo {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Echo {
    #[tool(description = "Send the text back")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        args.text
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("quickstart-echo", "0.0.0"))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The MCP server: rmcp's stateful streamable-HTTP service, which routes
    // responses by request id alone (the bug the guard fixes).
    let mcp = StreamableHttpService::new(
        || {
            Ok(Echo {
                tool_router: Echo::tool_router(),
            })
        },
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );

    // The guard goes outside the MCP service: it must see every POST of a
    // session before the server does. OnDuplicate::Remap is the default.
    // The network protections go outside the guard, cheapest first, so a
    // request they refuse is never read.
    let guard = IdGuardLayer::new();
    let protected = ServiceBuilder::new()
        .layer(HeadLimitLayer::new(16 * 1024)) // 431 over 16 KiB of head
        .layer(HostLayer::new(HostPolicy::loopback())) // 421 / 403: DNS rebinding
        .layer(BodyPaceLayer::new()) // 408: 30 s pauses, or < 240 B/s after 5 s
        .layer(guard.clone());
    let app = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(protected);

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

    // What the guard did while the server ran.
    println!("{:?}", guard.stats());
    Ok(())
}
