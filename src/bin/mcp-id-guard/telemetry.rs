//! The binary's trace export: the library's `McpTraceLayer` records
//! `tracing` spans; here tracing-opentelemetry hands them to
//! `opentelemetry_sdk`'s batch processor and `opentelemetry-otlp`, set up
//! from the standard `OTEL_*` variables.
//!
//! - `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` turns export on (unset: off, the
//!   client's `traceparent` passes untouched); `OTEL_SDK_DISABLED=true` or
//!   `OTEL_TRACES_EXPORTER=none` turn it off.
//! - `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`: `http/protobuf` (the default)
//!   or `grpc`; `https://` endpoints verify the collector against the
//!   system's roots, or `OTEL_EXPORTER_OTLP_(TRACES_)CERTIFICATE` (a PEM
//!   file) instead; TLS is rustls with the `ring` provider.
//! - Headers, timeout and compression (`gzip`) are read by
//!   opentelemetry-otlp; `OTEL_BSP_*` by the batch processor;
//!   `OTEL_TRACES_SAMPLER(_ARG)` by the tracer provider; `OTEL_SERVICE_NAME`
//!   and `OTEL_RESOURCE_ATTRIBUTES` by the resource (service name
//!   `mcp-id-guard` unless they name one).
//!
//! What a collector that is down, slow or hostile can cost: nothing on a
//! request (a finished span goes into the batch processor's bounded queue,
//! or is dropped and counted when it is full); each export is bounded by
//! the export timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default) on
//! the runtime; shutdown waits at most two export timeouts (the export in
//! flight, then the flush). Spans exported and dropped (queue full, export
//! failed or timed out) are counted in
//! `mcp_id_guard_trace_spans_exported_total` and `…_dropped_total`. Header
//! values are never logged.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Context;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, Span, SpanData,
    SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;

/// The batch processor's queue when `OTEL_BSP_MAX_QUEUE_SIZE` is unset.
const DEFAULT_QUEUE: u64 = 2048;
/// The export timeout when `OTEL_EXPORTER_OTLP_TIMEOUT` is unset.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// Spans exported and dropped, for `/metrics`, and the spans handed to the
/// batch processor and not yet exported or dropped.
#[derive(Debug, Default)]
struct Counts {
    exported: Counter,
    dropped: Counter,
    pending: AtomicU64,
    failures: Throttle,
}

/// Logs a failed export at most once per 10 s, counting the others.
#[derive(Debug, Default)]
struct Throttle {
    last: std::sync::Mutex<Option<std::time::Instant>>,
    skipped: AtomicU64,
}

impl Throttle {
    /// `Some(failures not logged since the last line)` when one may be
    /// logged now.
    fn ready(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < Duration::from_secs(10)) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.skipped.swap(0, Ordering::Relaxed))
    }
}

/// The tracer provider the binary exports through, and its counts.
pub(crate) struct Telemetry {
    provider: SdkTracerProvider,
    counts: Arc<Counts>,
    export_timeout: Duration,
    /// Where to, and how, for the startup log (no header values).
    pub(crate) description: String,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

fn var(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|name| std::env::var(name).ok())
        .filter(|value| !value.trim().is_empty())
}

impl Telemetry {
    /// The export the `OTEL_*` variables ask for, or `None`; built within
    /// the Tokio runtime (the exporters' clients run on it).
    pub(crate) fn from_env() -> Result<Option<Self>, String> {
        if var(&["OTEL_SDK_DISABLED"]).is_some_and(|value| value.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var(&["OTEL_TRACES_EXPORTER"]).as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => return Err(format!("OTEL_TRACES_EXPORTER={other}: only otlp or none")),
        }
        let Some(endpoint) = var(&[
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]) else {
            return Ok(None);
        };
        let protocol = match var(&[
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ])
        .as_deref()
        {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") => Protocol::Grpc,
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL={other}: only grpc or http/protobuf"
                ))
            }
        };
        let export_timeout = match var(&[
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]) {
            None => DEFAULT_TIMEOUT,
            Some(millis) => millis
                .trim()
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| format!("OTEL_EXPORTER_OTLP_TIMEOUT={millis}: milliseconds"))?,
        };
        let queue = match var(&["OTEL_BSP_MAX_QUEUE_SIZE"]) {
            None => DEFAULT_QUEUE,
            Some(size) => size
                .trim()
                .parse()
                .map_err(|_| format!("OTEL_BSP_MAX_QUEUE_SIZE={size}: a number"))?,
        };
        let roots = roots(var(&[
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ]))?;
        let exporter = match protocol {
            Protocol::Grpc => {
                let mut tls = tonic::transport::ClientTlsConfig::new();
                tls = match &roots {
                    Roots::System => tls.with_native_roots(),
                    Roots::File(pem) => {
                        tls.ca_certificate(tonic::transport::Certificate::from_pem(pem))
                    }
                };
                let builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_timeout(export_timeout);
                // TLS only to an `https://` collector (tonic would apply it
                // to a plain one too).
                if endpoint.starts_with("https://") {
                    builder.with_tls_config(tls).build()
                } else {
                    builder.build()
                }
            }
            Protocol::HttpProtobuf => {
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(roots.client_config()?)
                    .https_or_http()
                    .enable_http1()
                    .build();
                let client =
                    opentelemetry_http::hyper::HyperClient::new(connector, export_timeout, None);
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_timeout(export_timeout)
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .build()
            }
        }
        .map_err(|error| format!("OpenTelemetry exporter: {error}"))?;
        let counts = Arc::new(Counts::default());
        let counted = Counted {
            inner: Arc::new(exporter),
            counts: Arc::clone(&counts),
            runtime: tokio::runtime::Handle::current(),
            timeout: export_timeout,
        };
        let batch = BatchSpanProcessor::builder(counted)
            .with_batch_config(BatchConfigBuilder::default().build())
            .build();
        let bounded = Bounded {
            inner: batch,
            counts: Arc::clone(&counts),
            queue,
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(bounded)
            .with_resource(resource())
            .build();
        let protocol = match protocol {
            Protocol::Grpc => "OTLP/gRPC",
            Protocol::HttpProtobuf => "OTLP/HTTP protobuf",
        };
        Ok(Some(Self {
            provider,
            counts,
            export_timeout,
            description: format!("{endpoint} ({protocol})"),
        }))
    }

    /// The tracer the guard's spans go to (the scope `mcp-id-guard`).
    pub(crate) fn tracer(&self) -> SdkTracer {
        self.provider.tracer("mcp-id-guard")
    }

    /// Registers the exported and dropped span counters.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "mcp_id_guard_trace_spans_exported",
            "Spans the OTLP collector accepted (present while traces are exported)",
            self.counts.exported.clone(),
        );
        registry.register(
            "mcp_id_guard_trace_spans_dropped",
            "Spans dropped: the trace queue was full (OTEL_BSP_MAX_QUEUE_SIZE), or their export failed or timed out",
            self.counts.dropped.clone(),
        );
    }

    /// Exports what is left, within two export timeouts.
    pub(crate) async fn shutdown(self) {
        let bound = self.export_timeout * 2;
        let provider = self.provider;
        let stop = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(bound));
        // The blocking task itself is bounded by `bound`; this bounds the
        // wait for it even so.
        let _ = tokio::time::timeout(bound + Duration::from_millis(100), stop).await;
        // Whatever the flush did not export is lost.
        let left = self.counts.pending.swap(0, Ordering::Relaxed);
        self.counts.dropped.inc_by(left);
        tracing::info!(
            exported = self.counts.exported.get(),
            dropped = self.counts.dropped.get(),
            "trace exporter stopped"
        );
    }
}

/// The service name `mcp-id-guard` unless the variables name one.
fn resource() -> Resource {
    let named = var(&["OTEL_SERVICE_NAME"]).is_some()
        || var(&["OTEL_RESOURCE_ATTRIBUTES"]).is_some_and(|attributes| {
            attributes
                .split(',')
                .any(|pair| pair.trim_start().starts_with("service.name="))
        });
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name("mcp-id-guard").build()
    }
}

/// What the collector's certificate is verified against.
enum Roots {
    System,
    /// A PEM file's contents.
    File(Vec<u8>),
}

fn roots(certificate: Option<String>) -> Result<Roots, String> {
    let Some(path) = certificate else {
        return Ok(Roots::System);
    };
    let pem = std::fs::read(&path)
        .map_err(|error| format!("OTEL_EXPORTER_OTLP_CERTIFICATE={path}: {error}"))?;
    Ok(Roots::File(pem))
}

impl Roots {
    /// rustls with the `ring` provider, trusting these roots.
    fn client_config(&self) -> Result<rustls::ClientConfig, String> {
        let mut store = rustls::RootCertStore::empty();
        match self {
            Roots::System => {
                let native = rustls_native_certs::load_native_certs();
                store.add_parsable_certificates(native.certs);
            }
            Roots::File(pem) => {
                for certificate in CertificateDer::pem_slice_iter(pem) {
                    let certificate = certificate
                        .map_err(|error| format!("OTEL_EXPORTER_OTLP_CERTIFICATE: {error}"))?;
                    store
                        .add(certificate)
                        .map_err(|error| format!("OTEL_EXPORTER_OTLP_CERTIFICATE: {error}"))?;
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| format!("TLS: {error}"))?
            .with_root_certificates(store)
            .with_no_client_auth())
    }
}

/// The batch processor, with its queue bounded by what is handed to it and
/// not yet exported: a span over the bound is dropped and counted here
/// (the processor would drop it too, uncounted).
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    counts: Arc<Counts>,
    queue: u64,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.counts.pending.fetch_add(1, Ordering::Relaxed) >= self.queue {
            self.counts.pending.fetch_sub(1, Ordering::Relaxed);
            self.counts.dropped.inc();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, run on the Tokio runtime (the batch processor's own
/// thread has none), each export bounded by the export timeout, and its
/// spans counted exported or dropped.
#[derive(Debug)]
struct Counted<E> {
    inner: Arc<E>,
    counts: Arc<Counts>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl<E: SpanExporter + 'static> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let inner = Arc::clone(&self.inner);
        let timeout = self.timeout;
        let export = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, inner.export(batch)).await });
        let result = match export.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(OTelSdkError::Timeout(timeout)),
            Err(error) => Err(OTelSdkError::InternalFailure(error.to_string())),
        };
        self.counts.pending.fetch_sub(spans, Ordering::Relaxed);
        match &result {
            Ok(()) => {
                self.counts.exported.inc_by(spans);
            }
            Err(error) => {
                self.counts.dropped.inc_by(spans);
                if let Some(not_logged) = self.counts.failures.ready() {
                    // The exporter's error, never the request's headers.
                    tracing::warn!(%error, not_logged, "trace export failed: {spans} span(s) dropped");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called once, as the provider is built, before any export holds a
        // clone.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}
