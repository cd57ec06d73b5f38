//! [`Tracer`]: what the request side of tracing shares with the export
//! task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::protect::metrics::Metrics;
use crate::throttle::Throttle;
use crate::trace::legacy::config::Sampler;
use crate::trace::legacy::context::Minter;
use crate::trace::legacy::record::SpanRecord;

/// Log kinds of the throttle.
const QUEUE_FULL: usize = 0;
pub(crate) const EXPORT_FAILED: usize = 1;

/// What the request side of tracing shares: the queue's sending end, the
/// id minter and the sampler.
#[derive(Debug)]
pub(crate) struct Tracer {
    sender: mpsc::Sender<SpanRecord>,
    pub(crate) minter: Minter,
    pub(crate) sampler: Sampler,
    pub(crate) counts: Arc<Counts>,
}

impl Tracer {
    pub(crate) fn new(
        sender: mpsc::Sender<SpanRecord>,
        sampler: Sampler,
        counts: Arc<Counts>,
    ) -> Self {
        Self {
            sender,
            minter: Minter::new(),
            sampler,
            counts,
        }
    }

    /// Queues a finished span, or drops it when the queue is full.
    pub(crate) fn send(&self, span: SpanRecord) {
        if self.sender.try_send(span).is_err() {
            self.counts.dropped(1);
            if let Some(not_logged) = self.counts.throttle.ready(QUEUE_FULL) {
                tracing::warn!(
                    not_logged,
                    "trace queue full (OTEL_BSP_MAX_QUEUE_SIZE): span dropped"
                );
            }
        }
    }
}

/// What became of the spans, shared by the request side and the task.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) exported: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) throttle: Throttle<2>,
    /// Where they are counted too, for a `/metrics` endpoint.
    pub(crate) metrics: Option<Metrics>,
}

impl Counts {
    pub(crate) fn exported(&self, spans: u64) {
        self.exported.fetch_add(spans, Ordering::Relaxed);
        if let Some(metrics) = &self.metrics {
            metrics.spans(spans, 0);
        }
    }

    pub(crate) fn dropped(&self, spans: u64) {
        self.dropped.fetch_add(spans, Ordering::Relaxed);
        if let Some(metrics) = &self.metrics {
            metrics.spans(0, spans);
        }
    }
}
