//! The admin listener (`--admin-listen`): `/healthz`, `/readyz` and
//! `/metrics` (Prometheus text format), on its own address so that probes
//! and scrapes never mix with MCP traffic or pass its Host checks.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use mcp_id_guard::proxy::UpstreamFailure;
use mcp_id_guard::IdGuardLayer;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

type StatusLabel = [(&'static str, u16); 1];
type KindLabel = [(&'static str, &'static str); 1];
type ReasonLabel = [(&'static str, &'static str); 1];

/// What the proxy records as it serves: answers by status, upstream
/// failures by kind, refusals by kind, and how long requests took to their
/// response headers.
#[derive(Debug)]
pub(crate) struct Metrics {
    responses: Family<StatusLabel, Counter>,
    upstream_failures: Family<KindLabel, Counter>,
    refused: Family<KindLabel, Counter>,
    closed: Family<ReasonLabel, Counter>,
    client_resets: Counter,
    duration: Histogram,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            responses: Family::default(),
            upstream_failures: Family::default(),
            refused: Family::default(),
            closed: Family::default(),
            client_resets: Counter::default(),
            // 0.5 ms to about 16 s.
            duration: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
        }
    }

    /// A response left for the client after `elapsed`.
    pub(crate) fn answered(
        &self,
        status: StatusCode,
        failure: Option<UpstreamFailure>,
        elapsed: Duration,
    ) {
        self.responses
            .get_or_create(&[("status", status.as_u16())])
            .inc();
        if let Some(failure) = failure {
            self.upstream_failures
                .get_or_create(&[("kind", failure.as_str())])
                .inc();
        }
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// A request refused before the guard: `host`, `origin`, `header_size`
    /// or `connection_closing`.
    pub(crate) fn refused(&self, kind: &'static str) {
        self.refused.get_or_create(&[("kind", kind)]).inc();
    }

    /// A client connection the proxy closes for one of its budgets.
    pub(crate) fn closed(&self, reason: crate::connection::Closing) {
        self.closed
            .get_or_create(&[("reason", reason.as_str())])
            .inc();
    }

    /// An HTTP/2 stream the client reset before its response ended.
    pub(crate) fn client_reset(&self) {
        self.client_resets.inc();
    }
}

/// Reads the guard's counters and the open connections at scrape time.
#[derive(Debug)]
struct Live {
    guard: IdGuardLayer,
    connections: Arc<Semaphore>,
    max_connections: usize,
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = self.guard.stats();
        let counters: [(&str, &str, u64); 9] = [
            ("mcp_id_guard_passed", "Requests forwarded with the client's own id", stats.passed_total),
            ("mcp_id_guard_remapped", "Requests forwarded with a server-side id", stats.remapped_total),
            ("mcp_id_guard_rejected", "Requests the guard answered itself (duplicate under reject, over the per-session cap or the table budget, session id too long)", stats.rejected_total),
            ("mcp_id_guard_queued", "Requests that waited for their id under the queue policy", stats.queued_total),
            ("mcp_id_guard_cancelled", "notifications/cancelled that named a request of the session", stats.cancelled_total),
            ("mcp_id_guard_restored", "Client ids put back into responses", stats.restored_total),
            ("mcp_id_guard_restore_refused", "Ids in responses written like server-side ids this guard did not issue for the response's session (another session's, or forged), passed on unrestored", stats.restore_refused_total),
            ("mcp_id_guard_abandoned_evicted", "Abandoned ids forgotten early to stay within the table's byte budget or count cap", stats.abandoned_evicted_total),
            ("mcp_id_guard_restart_remapped", "Requests remapped because their session started before this process (restart window)", stats.restart_remapped_total),
        ];
        for (name, help, value) in counters {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(metric)?;
        }
        let open = self.max_connections - self.connections.available_permits();
        let gauges: [(&str, &str, i64); 5] = [
            (
                "mcp_id_guard_in_flight_requests",
                "Tracked requests whose exchange has not ended",
                gauge(stats.in_flight_requests),
            ),
            (
                "mcp_id_guard_tracked_sessions",
                "Sessions with a request in flight",
                gauge(stats.tracked_sessions),
            ),
            (
                "mcp_id_guard_abandoned_ids",
                "Ids of given-up exchanges still shadowed",
                gauge(stats.abandoned_ids),
            ),
            (
                "mcp_id_guard_table_bytes",
                "Bytes the session table holds (bounded by --max-table-bytes)",
                gauge(stats.table_bytes),
            ),
            (
                "mcp_id_guard_client_connections",
                "Client connections open",
                gauge(open),
            ),
        ];
        for (name, help, value) in gauges {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(metric)?;
        }
        Ok(())
    }
}

fn gauge(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Everything the admin endpoints read.
pub(crate) struct Admin {
    registry: Registry,
    /// `host:port` of the upstream, for `/readyz`.
    upstream: String,
    ready_timeout: Duration,
}

impl Admin {
    pub(crate) fn new(
        metrics: &Arc<Metrics>,
        guard: IdGuardLayer,
        connections: Arc<Semaphore>,
        max_connections: usize,
        upstream: String,
        ready_timeout: Duration,
    ) -> Self {
        let mut registry = Registry::default();
        registry.register(
            "mcp_id_guard_responses",
            "Responses sent to clients, by HTTP status",
            metrics.responses.clone(),
        );
        registry.register(
            "mcp_id_guard_upstream_failures",
            "Requests the upstream did not answer, by kind (the proxy answered 502, 503 or 504)",
            metrics.upstream_failures.clone(),
        );
        registry.register(
            "mcp_id_guard_refused",
            "Requests refused before the guard, by kind (host, origin, header_size, \
             connection_closing: arrived on a connection closing for its request cap or resets)",
            metrics.refused.clone(),
        );
        registry.register(
            "mcp_id_guard_connections_closed",
            "Client connections the proxy closed itself, by reason (request_cap: \
             --max-requests-per-connection; client_resets: --max-client-resets)",
            metrics.closed.clone(),
        );
        registry.register(
            "mcp_id_guard_client_resets",
            "HTTP/2 streams the client reset before their response ended",
            metrics.client_resets.clone(),
        );
        registry.register(
            "mcp_id_guard_request_duration_seconds",
            "Time from a request's head to its response headers",
            metrics.duration.clone(),
        );
        registry.register_collector(Box::new(Live {
            guard,
            connections,
            max_connections,
        }));
        Self {
            registry,
            upstream,
            ready_timeout,
        }
    }

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
                match prometheus_client::encoding::text::encode(&mut body, &self.registry) {
                    Ok(()) => {
                        let mut response = text(StatusCode::OK, &body);
                        response.headers_mut().insert(
                            header::CONTENT_TYPE,
                            http::HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        );
                        response
                    }
                    Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n"),
                }
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
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Serves the admin endpoints on `listener` until the process ends. Plain
/// HTTP/1.1; each connection is bounded by the same head timeout as the
/// proxy's (a scrape sends its request at once).
pub(crate) async fn serve(listener: TcpListener, admin: Arc<Admin>, head_timeout: Duration) {
    let server = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout)
        .clone();
    // Few connections are expected (probes, a scraper); a cap keeps them
    // within the descriptors the connection caps leave in reserve.
    let permits = Arc::new(Semaphore::new(16));
    loop {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let (stream, peer): (TcpStream, SocketAddr) = match listener.accept().await {
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
