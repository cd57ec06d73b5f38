//! The exporter: a background task that batches finished spans from a
//! bounded queue and posts them to the collector, one export at a time.
//!
//! The request path only ever `try_send`s into the queue: a full queue
//! drops the span (counted), it never waits. A collector that is down or
//! never answers costs at most one export timeout per batch, during which
//! the queue fills and further spans are dropped: memory stays bounded by
//! `OTEL_BSP_MAX_QUEUE_SIZE` plus one batch, and requests are not slowed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{Request, Uri};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};

use crate::trace::legacy::config::OtlpConfig;
use crate::trace::legacy::otlp::export_request;
use crate::trace::legacy::record::SpanRecord;
use crate::trace::legacy::tracer::{Counts, Tracer, EXPORT_FAILED};

/// The export task and the way to stop it, until shutdown takes them.
type Running = (oneshot::Sender<()>, JoinHandle<()>);

/// Sends the spans of a [`TraceLayer`](crate::trace::legacy::TraceLayer) to an OTLP
/// collector over HTTP (`http/protobuf`): batched in a background task, with
/// a bounded queue; see the [module docs](crate::trace). Cheap to clone: one
/// exporter.
#[derive(Debug, Clone)]
pub struct OtlpExporter {
    pub(crate) tracer: Arc<Tracer>,
    task: Arc<Mutex<Option<Running>>>,
    export_timeout: Duration,
}

impl OtlpExporter {
    /// Starts the export task on the current Tokio runtime.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn start(config: OtlpConfig) -> Self {
        let (sender, receiver) = mpsc::channel(config.max_queue_size);
        let counts = Arc::new(Counts {
            metrics: config.metrics.clone(),
            ..Counts::default()
        });
        if let Some(metrics) = &counts.metrics {
            // The counters appear, at zero.
            metrics.spans(0, 0);
        }
        let (stop, stopped) = oneshot::channel();
        let export_timeout = config.export_timeout;
        let tracer = Arc::new(Tracer::new(sender, config.sampler, Arc::clone(&counts)));
        let task = tokio::spawn(run(receiver, config, counts, stopped));
        Self {
            tracer,
            task: Arc::new(Mutex::new(Some((stop, task)))),
            export_timeout,
        }
    }

    /// Spans the collector accepted (a `2xx` answer to their export).
    pub fn exported_spans(&self) -> u64 {
        self.tracer.counts.exported.load(Ordering::Relaxed)
    }

    /// Spans dropped: the queue was full, their export failed or timed out,
    /// or they were still queued when [`shutdown`](Self::shutdown) ran out
    /// of time.
    pub fn dropped_spans(&self) -> u64 {
        self.tracer.counts.dropped.load(Ordering::Relaxed)
    }

    /// Exports what is queued and stops the task, within two export
    /// timeouts (`OTEL_EXPORTER_OTLP_TIMEOUT`: the export in flight, then
    /// the flush); spans still queued then are dropped, as are spans that
    /// end later. Later calls do nothing.
    pub async fn shutdown(&self) {
        let task = self
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some((stop, mut task)) = task {
            let _ = stop.send(());
            // The task bounds the export in flight and its flush; this
            // bounds a task that somehow did not.
            let bound = self.export_timeout * 2 + Duration::from_millis(100);
            if timeout(bound, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

/// The export task: a batch goes when full, or every schedule delay.
async fn run(
    mut receiver: mpsc::Receiver<SpanRecord>,
    config: OtlpConfig,
    counts: Arc<Counts>,
    mut stopped: oneshot::Receiver<()>,
) {
    let collector = Collector { config, counts };
    let max = collector.config.max_export_batch_size;
    let delay = collector.config.schedule_delay;
    let mut batch = Vec::with_capacity(max);
    let mut next = Instant::now() + delay;
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            received = receiver.recv() => {
                let Some(span) = received else { break };
                batch.push(span);
                if batch.len() >= max {
                    collector.export(&mut batch).await;
                    next = Instant::now() + delay;
                }
            }
            () = sleep_until(next) => {
                if !batch.is_empty() {
                    collector.export(&mut batch).await;
                }
                next = Instant::now() + delay;
            }
        }
    }
    // Flush: what is batched and queued, within one export timeout in all.
    receiver.close();
    let flush = async {
        loop {
            while batch.len() < max {
                match receiver.try_recv() {
                    Ok(span) => batch.push(span),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            collector.export(&mut batch).await;
        }
    };
    let bound = collector.config.export_timeout;
    if timeout(bound, flush).await.is_err() {
        let left = batch.len() + receiver.len();
        collector.counts.dropped(left as u64);
    }
}

struct Collector {
    config: OtlpConfig,
    counts: Arc<Counts>,
}

impl Collector {
    /// Posts the batch (emptying it), counting its spans exported or
    /// dropped.
    async fn export(&self, batch: &mut Vec<SpanRecord>) {
        let body = export_request(&self.config.resource, batch);
        // Counted dropped unless the collector takes them, also when the
        // flush's bound cuts this export short.
        let mut in_flight = InFlight {
            counts: &self.counts,
            spans: batch.len() as u64,
        };
        batch.clear();
        let outcome = match timeout(self.config.export_timeout, self.post(body)).await {
            Ok(outcome) => outcome,
            Err(_) => Err("timed out".to_owned()),
        };
        match outcome {
            Ok(()) => {
                let spans = std::mem::take(&mut in_flight.spans);
                self.counts.exported(spans);
            }
            Err(error) => {
                if let Some(not_logged) = self.counts.throttle.ready(EXPORT_FAILED) {
                    let endpoint = &self.config.endpoint;
                    tracing::warn!(
                        collector = %format_args!(
                            "{}:{}",
                            endpoint.host().unwrap_or_default(),
                            endpoint.port_u16().unwrap_or(80)
                        ),
                        %error,
                        spans = in_flight.spans,
                        not_logged,
                        "could not export spans; dropped"
                    );
                }
            }
        }
    }

    /// One POST on a connection of its own (an export every few seconds
    /// needs no pool; a connection left by a collector that hung is gone
    /// with it).
    async fn post(&self, body: Vec<u8>) -> Result<(), String> {
        let endpoint: &Uri = &self.config.endpoint;
        let host = endpoint.host().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = endpoint.port_u16().unwrap_or(80);
        let stream = TcpStream::connect((host, port))
            .await
            .map_err(|error| format!("connect: {error}"))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| format!("handshake: {error}"))?;
        let _driver = AbortOnDrop(tokio::spawn(connection));
        let path = endpoint.path_and_query().map_or("/", |path| path.as_str());
        let mut request = Request::post(path)
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| error.to_string())?;
        let headers = request.headers_mut();
        for (name, value) in &self.config.headers {
            headers.insert(name.clone(), value.clone());
        }
        let authority = endpoint
            .authority()
            .map_or("", |authority| authority.as_str());
        headers.insert(
            HOST,
            authority
                .parse()
                .map_err(|_| "endpoint authority is no Host".to_owned())?,
        );
        headers.insert(
            CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-protobuf"),
        );
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| format!("request: {error}"))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("collector answered {}", response.status()))
        }
    }
}

/// Spans of an export not (yet) taken by the collector: dropped, however
/// the export ends.
struct InFlight<'a> {
    counts: &'a Counts,
    spans: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counts.dropped(self.spans);
    }
}

/// Ends the connection's task with the export, however the export ends.
struct AbortOnDrop(JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
