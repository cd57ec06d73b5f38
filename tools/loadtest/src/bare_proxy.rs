//! A bare hyper-util reverse proxy: hyper's server (HTTP/1 and HTTP/2, as
//! the `mcp-id-guard` binary serves) in front of hyper-util's pooled client,
//! forwarding every request as it comes, with nothing of the guard. The
//! floor that hyper itself sets, measured beside nginx and mcp-id-guard by
//! `benches/held_vs_nginx.sh`, `benches/proxy_vs_nginx.sh` (`HYPER=1`) and
//! `benches/proxy_instructions.sh`; not a proxy to run. Both of its sides set
//! TCP_NODELAY, as the binary's do: with Nagle on, each small answer waits
//! out the peer's delayed ACK (about 40 ms here).

use std::net::SocketAddr;

use http::header::HOST;
use http::{HeaderValue, Request, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// Serves on `listen`, forwarding to `upstream`, until the process is killed.
pub(crate) async fn serve(listen: SocketAddr, upstream: SocketAddr) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    let host = HeaderValue::from_str(&upstream.to_string())?;
    println!("proxying {listen} to {upstream}");
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let (client, host) = (client.clone(), host.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                let (client, host) = (client.clone(), host.clone());
                async move {
                    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
                    *request.uri_mut() = Uri::try_from(format!("http://{upstream}{path}"))?;
                    request.headers_mut().insert(HOST, host);
                    anyhow::Ok(client.request(request).await?)
                }
            });
            // A connection that fails ends; the proxy goes on.
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
