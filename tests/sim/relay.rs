//! Two proxies in series (#42): in some seeds the guard's proxy reaches the
//! server through a relay, a second proxy of this crate without a guard
//! (`Server` and `Proxy`, as a deployment may chain a gateway in front of
//! the server). The relay's stand-ins (`502` when its connection to the
//! server breaks before the answer, `504` when the server does not answer
//! in time) carry the request's id in a JSON-RPC error, as this crate's
//! proxy writes them, but their `Unanswered` mark stays in the relay's
//! process. The guard must take a gateway status for a gateway's, never for
//! the server's answer: else it frees an id the server still runs a request
//! under, and the next `id: 1` reaches the server while it does.
//!
//! Under faults the relay stands where the guard's proxy stood: the link
//! held or partitioned is the relay's to the server, and the relay's
//! connections are the ones reset mid-response.

use std::time::Duration;

use http::Response;
use http_body_util::BodyExt;
use mcp_id_guard::proxy::{Proxy, ProxyBody};
use mcp_id_guard::server::Server;
use tower::{BoxError, ServiceBuilder};

use crate::net::{SimConnector, SimListener};

pub const RELAY_HOST: &str = "relay";
pub const RELAY_PORT: u16 = 8090;

/// The relay, proxying to `upstream` through `connector`; it answers `504`
/// after `response_timeout` (shorter than the guard's proxy's, so that its
/// `504` is what the guard sees).
pub async fn serve(
    upstream: String,
    connector: SimConnector,
    response_timeout: Duration,
) -> turmoil::Result {
    let proxy = Proxy::builder()
        .connector(connector)
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Some(response_timeout))
        .idle_timeout(Some(response_timeout))
        .max_connections(Some(256))
        .build(&upstream)?;
    let service = ServiceBuilder::new()
        .map_response(|response: Response<ProxyBody>| {
            response.map(|body| body.map_err(Into::<BoxError>::into).boxed_unsync())
        })
        .service(proxy);
    let server = Server::builder()
        .header_read_timeout(Some(Duration::from_secs(10)))
        .keep_alive_timeout(Some(Duration::from_secs(20)))
        .send_timeout(Some(Duration::from_secs(30)))
        .max_connections(512)
        .build();
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", RELAY_PORT)).await?;
    server
        .serve(
            SimListener(listener),
            move |_client| service.clone(),
            std::future::pending(),
        )
        .await;
    Ok(())
}
