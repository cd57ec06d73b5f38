//! The admin listener (`--admin-listen`): `/healthz`, `/readyz` and
//! `/metrics` (Prometheus text format), on its own address so that probes
//! and scrapes never mix with MCP traffic or pass its Host checks.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use mcp_id_guard::protect::metrics::Metrics;
use mcp_id_guard::server::{ClientBody, ServerBuilder};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};

/// Everything the admin endpoints read.
pub(crate) struct Admin {
    /// Every family `/metrics` serves: the metrics layer's and the
    /// server's, the guard's counters, the trace exporter's.
    pub(crate) registry: Registry,
    /// `host:port` of the upstream, for `/readyz`.
    pub(crate) upstream: String,
    pub(crate) ready_timeout: Duration,
}

impl Admin {
    async fn answer(&self, request: &Request<ClientBody>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
        }
        match request.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => {
                let connect = TcpStream::connect(self.upstream.as_str());
                match tokio::time::timeout(self.ready_timeout, connect).await {
                    Ok(Ok(_)) => text(StatusCode::OK, "ready\n"),
                    Ok(Err(error)) => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!("the upstream does not accept connections: {error}\n"),
                    ),
                    Err(_) => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the upstream did not accept a connection in time\n",
                    ),
                }
            }
            "/metrics" => {
                let mut body = String::new();
                // Writing into a `String` cannot fail.
                let _ = prometheus_client::encoding::text::encode(&mut body, &self.registry);
                let mut response = text(StatusCode::OK, &body);
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(Metrics::CONTENT_TYPE),
                );
                response
            }
            _ => text(StatusCode::NOT_FOUND, "/healthz, /readyz or /metrics\n"),
        }
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_owned())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Serves the admin endpoints on `listener` until the process ends, with
/// the main listener's connection machinery (`mcp_id_guard::server`): its
/// keep-alive timeout and per-connection request budget, and a connection
/// cap and head and send timeouts of its own (`--admin-max-connections`,
/// `--admin-header-read-timeout`, `--admin-send-timeout`). At the cap, idle
/// connections make room for new ones; a client that pipelines requests and
/// never reads the answers, or never finishes a head, is dropped within
/// seconds instead of holding a slot for as long as it likes, so a liveness
/// probe still gets through whatever the other connections do.
pub(crate) async fn serve(listener: TcpListener, admin: Arc<Admin>, server: ServerBuilder) {
    let server = server.build();
    let service = AdminService(admin);
    // The admin listener lives as long as the process: the main listener's
    // shutdown ends the runtime, and with it this task.
    server
        .serve(listener, |_| service.clone(), std::future::pending())
        .await;
}

/// The admin endpoints as a tower service, for `mcp_id_guard::server`.
#[derive(Clone)]
struct AdminService(Arc<Admin>);

impl tower_service::Service<Request<ClientBody>> for AdminService {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ClientBody>) -> Self::Future {
        let admin = Arc::clone(&self.0);
        Box::pin(async move { Ok(admin.answer(&request).await) })
    }
}
