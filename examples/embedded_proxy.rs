//! The guard proxy embedded in a program of one's own (axum here).
//!
//! It starts a stand-in for an MCP server written in another language (an
//! in-process HTTP server that echoes the JSON-RPC id it receives), serves the
//! guarded proxy in front of it next to a `/healthz` route, behind the
//! network protections (Host/Origin check, head size limit, body pace), sends two
//! concurrent requests with the same id through it, prints what the upstream
//! saw and what each caller got back, and exits.
//!
//! ```sh
//! cargo run --example embedded_proxy --features proxy
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::routing::{get, post};
use axum::Router;
use mcp_id_guard::protect::head::HeadLimitLayer;
use mcp_id_guard::protect::host::HostPolicy;
use mcp_id_guard::protect::pace::BodyPaceLayer;
use mcp_id_guard::protect::ProtectLayer;
use mcp_id_guard::proxy::{ClientAddr, Proxy};
use mcp_id_guard::IdGuardLayer;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Barrier};
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // 1. The upstream: echoes each request's id and `params.who`. It holds
    //    every request until two are in flight, so they overlap for sure.
    let barrier = Arc::new(Barrier::new(2));
    let upstream = Router::new().route(
        "/mcp",
        post(move |body: String| {
            let barrier = Arc::clone(&barrier);
            async move {
                let request: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                println!("upstream saw id {}", request["id"]);
                barrier.wait().await;
                let reply = serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": request["id"],
                    "result": { "echo": request["params"]["who"] },
                });
                ([("content-type", "application/json")], reply.to_string())
            }
        }),
    );
    let upstream_listener = TcpListener::bind("127.0.0.1:0").await?;
    let upstream_addr = upstream_listener.local_addr()?;
    tokio::spawn(async move { axum::serve(upstream_listener, upstream).await });

    // 2. The user's own app: the guarded proxy on /mcp, beside other routes,
    //    behind the protections a server facing the network needs (the
    //    cheapest checks first, all before the guard reads a body).
    let guard = IdGuardLayer::new();
    let proxy = Proxy::new(&format!("http://{upstream_addr}"))?;
    let mcp = ServiceBuilder::new()
        // In this order: 421/403 for a Host or Origin other than loopback
        // (DNS rebinding) after 431 for request heads over 16 KiB, then 408
        // for bodies that pause 30 s or arrive slower than 240 B/s.
        .layer(
            ProtectLayer::new(HostPolicy::loopback())
                .head_limit(HeadLimitLayer::new(16 * 1024))
                .body_pace(
                    BodyPaceLayer::new()
                        .idle_timeout(Some(Duration::from_secs(30)))
                        .min_rate(240)
                        .grace(Duration::from_secs(5)),
                ),
        )
        .layer(guard.clone())
        .service(proxy);
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route_service("/mcp", mcp)
        // Optional: tell the proxy the client's address for X-Forwarded-For.
        .layer(axum::middleware::map_request(
            |ConnectInfo(addr): ConnectInfo<SocketAddr>, mut request: Request| async move {
                request.extensions_mut().insert(ClientAddr(addr));
                request
            },
        ));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = stopped.await;
        })
        .await
    });
    println!("guarded proxy on http://{addr}/mcp -> http://{upstream_addr}/mcp");

    // 3. Two callers in one session, both with `id: 1`.
    let client = reqwest::Client::new();
    let call = |who: &'static str| {
        let request = client
            .post(format!("http://{addr}/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", "demo-session")
            .body(
                serde_json::json!({
                    "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": { "who": who },
                })
                .to_string(),
            );
        async move { anyhow::Ok(request.send().await?.text().await?) }
    };
    let (alice, bob) = tokio::join!(call("alice"), call("bob"));
    println!("alice got {}", alice?);
    println!("bob   got {}", bob?);
    println!("guard stats: {:?}", guard.stats());

    let _ = stop.send(());
    server.await??;
    Ok(())
}
