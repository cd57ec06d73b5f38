//! A finished span, as the exporter encodes it.

/// An attribute's value: the few kinds the guard records.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Str(Box<str>),
    Static(&'static str),
    Int(i64),
}

/// One finished span, as the exporter encodes it.
#[derive(Debug, Clone)]
pub(crate) struct SpanRecord {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
    /// The client's span, when it sent a valid `traceparent`.
    pub(crate) parent_id: Option<[u8; 8]>,
    /// The W3C trace flags the span was sampled with.
    pub(crate) flags: u8,
    pub(crate) name: String,
    pub(crate) start_unix_nanos: u64,
    pub(crate) end_unix_nanos: u64,
    pub(crate) attributes: Vec<(&'static str, Value)>,
    /// Status `ERROR` with this `error.type`; `None`: status unset.
    pub(crate) error: Option<&'static str>,
}
