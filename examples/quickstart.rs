// An rmcp MCP server with one tool, served by axum at
// http://127.0.0.1:8000/mcp, behind the network protections and the id guard.
// `cargo run --example quickstart`; stop it with Ctrl-C. (The quick start of
// README.md and of the crate docs is this file, as CI builds it.)

use std::sync::Arc;

use mcp_id_guard::protect::{host::HostPolicy, ProtectLayer};
use mcp_id_guard::IdGuardLayer;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use tower::ServiceBuilder;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    text: String,
}

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
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // rmcp's stateful streamable-HTTP service routes responses by request id
    // alone: the bug the guard fixes.
    let mcp = StreamableHttpService::new(
        || {
            Ok(Echo {
                tool_router: Echo::tool_router(),
            })
        },
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );

    // OnDuplicate::Remap by default. A clone of the layer reads its stats.
    let guard = IdGuardLayer::new();
    let layers = ServiceBuilder::new()
        // Head size (431), Host and Origin (421 / 403), body pace (408):
        // outside the guard, so a request they refuse is never read.
        .layer(ProtectLayer::new(HostPolicy::loopback()))
        // Innermost: it sees every POST of a session before the server does.
        .layer(guard.clone());
    let app = axum::Router::new().nest_service("/mcp", mcp).layer(layers);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    println!("{:?}", guard.stats());
    Ok(())
}
