//! The storage behind [`Metrics`](super::Metrics): families of series keyed
//! by their labels, and the latency histogram.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::guard::{GuardDecision, McpMethod};

/// The labels of one series, written as `name="value"` pairs. A series
/// gains a label (an MCP `method`, say) by a new key type, not a new family
/// mechanism.
pub(super) trait Labels: Ord + Clone {
    /// Writes the pairs without the braces.
    fn write(&self, out: &mut String);
}

/// `status="200"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Status(pub(super) u16);

impl Labels for Status {
    fn write(&self, out: &mut String) {
        let _ = write!(out, "status=\"{}\"", self.0);
    }
}

/// `kind="host"`, `reason="request_cap"`: one label with a fixed name and a
/// value from a short list of our own (nothing to escape).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Named(pub(super) &'static str, pub(super) &'static str);

impl Labels for Named {
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{}=\"{}\"", self.0, self.1);
    }
}

/// `mcp_method_name="tools/call",decision="remapped"`: one JSON-RPC message
/// as the guard handled it, and `gen_ai_tool_name="..."` for a `tools/call`
/// when tool names are asked for. Method and decision come from closed
/// lists, a tool name from the first few the operator allows (MCP tool
/// names, which need no escaping): a bounded number of series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Operation {
    pub(super) method: McpMethod,
    pub(super) decision: GuardDecision,
    pub(super) tool: Option<ToolLabel>,
}

/// The `gen_ai_tool_name` of a `tools/call`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum ToolLabel {
    /// One of the first distinct names seen.
    Named(Arc<str>),
    /// Past the cap, or no name MCP allows.
    Other,
}

impl Labels for Operation {
    fn write(&self, out: &mut String) {
        let _ = write!(
            out,
            "mcp_method_name=\"{}\",decision=\"{}\"",
            self.method.as_str(),
            self.decision.as_str()
        );
        match &self.tool {
            Some(ToolLabel::Named(name)) => {
                let _ = write!(out, ",gen_ai_tool_name=\"{name}\"");
            }
            Some(ToolLabel::Other) => out.push_str(",gen_ai_tool_name=\"other\""),
            None => {}
        }
    }
}

/// The tool names that have a series of their own: the first `max`
/// distinct ones recorded.
#[derive(Debug, Default)]
pub(super) struct ToolNames {
    names: RwLock<Vec<Arc<str>>>,
}

impl ToolNames {
    /// `name`'s label, admitting it while fewer than `max` names are.
    pub(super) fn label(&self, name: Option<&str>, max: usize) -> ToolLabel {
        let Some(name) = name else {
            return ToolLabel::Other;
        };
        let find = |names: &[Arc<str>]| names.iter().find(|known| ***known == *name).cloned();
        {
            let names = self.names.read().unwrap_or_else(|e| e.into_inner());
            if let Some(known) = find(&names) {
                return ToolLabel::Named(known);
            }
            if names.len() >= max {
                return ToolLabel::Other;
            }
        }
        let mut names = self.names.write().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = find(&names) {
            return ToolLabel::Named(known);
        }
        if names.len() >= max {
            return ToolLabel::Other;
        }
        let name: Arc<str> = Arc::from(name);
        names.push(Arc::clone(&name));
        ToolLabel::Named(name)
    }
}

/// One series per label set, created when first recorded. Recording takes a
/// read lock (shared by every core) unless the series is new.
#[derive(Debug)]
pub(super) struct Family<K, V> {
    series: RwLock<BTreeMap<K, V>>,
}

impl<K, V> Default for Family<K, V> {
    fn default() -> Self {
        Self {
            series: RwLock::new(BTreeMap::new()),
        }
    }
}

impl<K: Labels, V: Default> Family<K, V> {
    /// Runs `record` on `key`'s series.
    pub(super) fn with(&self, key: K, record: impl FnOnce(&V)) {
        {
            let series = self.series.read().unwrap_or_else(|e| e.into_inner());
            if let Some(value) = series.get(&key) {
                return record(value);
            }
        }
        let mut series = self.series.write().unwrap_or_else(|e| e.into_inner());
        record(series.entry(key).or_default());
    }

    /// Every series, in label order.
    pub(super) fn each(&self, mut visit: impl FnMut(&K, &V)) {
        let series = self.series.read().unwrap_or_else(|e| e.into_inner());
        for (key, value) in series.iter() {
            visit(key, value);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

impl<K: Labels> Family<K, AtomicU64> {
    pub(super) fn inc(&self, key: K) {
        self.with(key, |count| {
            count.fetch_add(1, Ordering::Relaxed);
        });
    }
}

/// Upper bounds of the latency buckets in seconds: 0.5 ms, doubling, to
/// about 16 s.
pub(super) const BUCKETS: usize = 16;

pub(super) fn bound(bucket: usize) -> f64 {
    0.0005 * f64::from(1_u32 << bucket)
}

/// Durations counted into [`BUCKETS`] buckets (each counting what is not in
/// a lower one), with their count and sum.
#[derive(Debug, Default)]
pub(super) struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub(super) fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(bucket) = (0..BUCKETS).find(|&bucket| seconds <= bound(bucket)) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// `(sum in seconds, count, cumulative count per bucket)`.
    pub(super) fn read(&self) -> (f64, u64, [u64; BUCKETS]) {
        let mut cumulative = [0; BUCKETS];
        let mut total = 0;
        for (bucket, count) in self.buckets.iter().enumerate() {
            total += count.load(Ordering::Relaxed);
            cumulative[bucket] = total;
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        (sum, self.count.load(Ordering::Relaxed), cumulative)
    }
}
