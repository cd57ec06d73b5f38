//! The OTLP `ExportTraceServiceRequest`, encoded as protobuf by hand: the
//! handful of messages the exporter sends, with the field numbers of
//! opentelemetry-proto (`collector/trace/v1/trace_service.proto`,
//! `trace/v1/trace.proto`, `common/v1/common.proto`,
//! `resource/v1/resource.proto`). Fields at their default value are left
//! out, as proto3 does.

use crate::trace::legacy::record::{SpanRecord, Value};

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// `Span.SpanKind.SPAN_KIND_SERVER`: the guard serves the request.
const SPAN_KIND_SERVER: u64 = 2;
/// `Status.StatusCode.STATUS_CODE_ERROR`.
const STATUS_CODE_ERROR: u64 = 2;

/// The instrumentation scope the spans come from.
const SCOPE_NAME: &str = "mcp-id-guard";

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    if value.is_empty() {
        return;
    }
    tag(out, field, LEN);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn uint(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        tag(out, field, VARINT);
        varint(out, value);
    }
}

fn fixed64(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        tag(out, field, FIXED64);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

fn fixed32(out: &mut Vec<u8>, field: u32, value: u32) {
    if value != 0 {
        tag(out, field, FIXED32);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

/// A nested message (always written, even empty: presence matters for
/// `AnyValue`).
fn message(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    write(&mut inner);
    tag(out, field, LEN);
    varint(out, inner.len() as u64);
    out.extend_from_slice(&inner);
}

/// `common.v1.KeyValue { key = 1; AnyValue value = 2 }`, `AnyValue {
/// string_value = 1; int_value = 3 }`.
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    message(out, field, |kv| {
        bytes(kv, 1, key.as_bytes());
        message(kv, 2, |any| match value {
            Value::Str(text) => string_value(any, text),
            Value::Static(text) => string_value(any, text),
            Value::Int(int) => {
                // int64 is a varint of the two's complement.
                tag(any, 3, VARINT);
                varint(any, *int as u64);
            }
        });
    });
}

/// `AnyValue.string_value`, written even when empty (the oneof is set).
fn string_value(any: &mut Vec<u8>, text: &str) {
    tag(any, 1, LEN);
    varint(any, text.len() as u64);
    any.extend_from_slice(text.as_bytes());
}

/// `collector.trace.v1.ExportTraceServiceRequest` of one resource (its
/// attributes: `resource`) and one scope holding `spans`.
pub(crate) fn export_request(resource: &[(String, String)], spans: &[SpanRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 * spans.len() + 128);
    // ExportTraceServiceRequest.resource_spans = 1
    message(&mut out, 1, |resource_spans| {
        // ResourceSpans.resource = 1; Resource.attributes = 1
        message(resource_spans, 1, |attributes| {
            for (key, value) in resource {
                key_value(attributes, 1, key, &Value::Str(value.as_str().into()));
            }
        });
        // ResourceSpans.scope_spans = 2
        message(resource_spans, 2, |scope_spans| {
            // ScopeSpans.scope = 1: InstrumentationScope { name = 1; version = 2 }
            message(scope_spans, 1, |scope| {
                bytes(scope, 1, SCOPE_NAME.as_bytes());
                bytes(scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
            });
            // ScopeSpans.spans = 2
            for span in spans {
                message(scope_spans, 2, |out| encode_span(out, span));
            }
        });
    });
    out
}

/// `trace.v1.Span`.
fn encode_span(out: &mut Vec<u8>, span: &SpanRecord) {
    bytes(out, 1, &span.trace_id);
    bytes(out, 2, &span.span_id);
    if let Some(parent) = &span.parent_id {
        bytes(out, 4, parent);
    }
    bytes(out, 5, span.name.as_bytes());
    uint(out, 6, SPAN_KIND_SERVER);
    fixed64(out, 7, span.start_unix_nanos);
    fixed64(out, 8, span.end_unix_nanos);
    for (key, value) in &span.attributes {
        key_value(out, 9, key, value);
    }
    if let Some(error) = span.error {
        key_value(out, 9, "error.type", &Value::Static(error));
        // Status { message = 2; code = 3 }
        message(out, 15, |status| {
            uint(status, 3, STATUS_CODE_ERROR);
        });
    }
    // The low 8 bits are the W3C trace flags.
    fixed32(out, 16, u32::from(span.flags));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_groups_of_seven() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        out.clear();
        varint(&mut out, u64::MAX);
        assert_eq!(out.len(), 10);
        out.clear();
        tag(&mut out, 16, FIXED32);
        assert_eq!(out, [0x85, 0x01]);
    }

    #[test]
    fn an_empty_request_still_names_its_resource_and_scope() {
        let encoded = export_request(&[("service.name".into(), "x".into())], &[]);
        // resource_spans (field 1, LEN) first.
        assert_eq!(encoded[0], 0x0a);
        assert!(encoded.windows(12).any(|w| w == b"service.name"));
        assert!(encoded.windows(12).any(|w| w == SCOPE_NAME.as_bytes()));
    }
}
