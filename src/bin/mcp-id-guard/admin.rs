//! The admin listener (`--admin-listen`): `/healthz`, `/readyz` and
//! `/metrics` (Prometheus text format), on its own address so that probes
//! and scrapes never mix with MCP traffic or pass its Host checks.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use mcp_id_guard::protect::metrics::Metrics;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

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
    async fn answer(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
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

/// Serves the admin endpoints on `listener` until the process ends. Plain
/// HTTP/1.1; each connection is bounded by the same head timeout as the
/// proxy's (a scrape sends its request at once).
pub(crate) async fn serve(listener: TcpListener, admin: Arc<Admin>, head_timeout: Duration) {
    let server = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .clone();
    // Few connections are expected (probes, a scraper); a cap keeps them
    // within the descriptors the connection caps leave in reserve.
    let permits = Arc::new(Semaphore::new(16));
    loop {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admin = Arc::clone(&admin);
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let admin = Arc::clone(&admin);
            async move { Ok::<_, Infallible>(admin.answer(&request).await) }
        });
        let connection = server.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "admin connection ended with an error");
            }
            drop(permit);
        });
    }
}
