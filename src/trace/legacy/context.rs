//! W3C Trace Context: the `traceparent` header read strictly and written,
//! and the ids this process mints.
//!
//! Ids come from SipHash-1-3 over a counter, keyed with 128 random bits
//! taken once per process from the OS-seeded `RandomState` (the same source
//! as the guard's id secret): unpredictable to clients, unique per process,
//! and no random-number crate.

use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};

use http::header::HeaderValue;
use http::HeaderMap;
use siphasher::sip::SipHasher13;

use crate::wire::id::random_word;

/// The W3C header that carries the caller's span.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The vendor state that travels with it.
pub(crate) const TRACESTATE: &str = "tracestate";

/// A `traceparent` header as read: version `00`, its trace id, the caller's
/// span id and the trace flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceParent {
    pub(crate) trace_id: [u8; 16],
    pub(crate) parent_id: [u8; 8],
    pub(crate) flags: u8,
}

impl TraceParent {
    /// The request's one `traceparent`, if it is valid. Several headers are
    /// invalid (W3C Trace Context: a vendor cannot tell which counts).
    pub(crate) fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut values = headers.get_all(TRACEPARENT).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        Self::parse(value.as_bytes())
    }

    /// Reads `00-<32 hex>-<16 hex>-<2 hex>` strictly: version `00` only, at
    /// exactly 55 bytes, lowercase hex, neither id all zeros. Anything else
    /// is `None`, and the request starts a new trace keeping nothing of it.
    pub(crate) fn parse(value: &[u8]) -> Option<Self> {
        if value.len() != 55 || &value[..3] != b"00-" || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0; 16];
        let mut parent_id = [0; 8];
        let mut flags = [0; 1];
        hex_into(&value[3..35], &mut trace_id)?;
        hex_into(&value[36..52], &mut parent_id)?;
        hex_into(&value[53..55], &mut flags)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            flags: flags[0],
        })
    }

    /// Whether the caller sampled the trace (flag bit 0).
    pub(crate) fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// The `traceparent` that names `span_id` as the parent: version `00`, and
/// only the sampled flag (the one flag of Trace Context level 1).
pub(crate) fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> HeaderValue {
    let mut text = String::with_capacity(55);
    text.push_str("00-");
    push_hex(&mut text, trace_id);
    text.push('-');
    push_hex(&mut text, span_id);
    text.push_str(if sampled { "-01" } else { "-00" });
    HeaderValue::from_str(&text).expect("hex is a valid header value")
}

/// Lowercase hex of `bytes`, appended to `out`.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
}

/// Lowercase hex only: `A-F` is invalid in `traceparent`.
fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    let digit = |byte: u8| match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    };
    for (pair, slot) in text.chunks_exact(2).zip(out.iter_mut()) {
        *slot = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(())
}

/// Mints trace and span ids, and tags session ids.
#[derive(Debug)]
pub(crate) struct Minter {
    ids: (u64, u64),
    sessions: (u64, u64),
    counter: AtomicU64,
}

impl Minter {
    pub(crate) fn new() -> Self {
        Self {
            ids: (random_word(11), random_word(12)),
            sessions: (random_word(13), random_word(14)),
            counter: AtomicU64::new(0),
        }
    }

    fn word(&self) -> u64 {
        let mut hasher = SipHasher13::new_with_keys(self.ids.0, self.ids.1);
        hasher.write_u64(self.counter.fetch_add(1, Ordering::Relaxed));
        hasher.finish()
    }

    /// A new span id, never all zeros.
    pub(crate) fn span_id(&self) -> [u8; 8] {
        loop {
            let word = self.word();
            if word != 0 {
                return word.to_be_bytes();
            }
        }
    }

    /// A new trace id, never all zeros.
    pub(crate) fn trace_id(&self) -> [u8; 16] {
        loop {
            let id = (u128::from(self.word()) << 64 | u128::from(self.word())).to_be_bytes();
            if id != [0; 16] {
                return id;
            }
        }
    }

    /// `mcp.session.id`: 16 hex digits of SipHash-1-3 of the session id
    /// under this process's random key. Session ids are bearer secrets in
    /// some servers: a key an attacker with the trace store does not have
    /// means a guessed id cannot be confirmed offline. The price: the tag
    /// of one session differs across restarts and replicas.
    pub(crate) fn session_tag(&self, session: &[u8]) -> String {
        let mut hasher = SipHasher13::new_with_keys(self.sessions.0, self.sessions.1);
        hasher.write(session);
        let mut tag = String::with_capacity(16);
        push_hex(&mut tag, &hasher.finish().to_be_bytes());
        tag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_reads_back_as_written() {
        let parent = TraceParent::parse(VALID.as_bytes()).unwrap();
        assert!(parent.sampled());
        assert_eq!(parent.parent_id, 0x00f0_67aa_0ba9_02b7_u64.to_be_bytes());
        let header = traceparent(&parent.trace_id, &parent.parent_id, true);
        assert_eq!(header.to_str().unwrap(), VALID);
        let unsampled = TraceParent::parse(&VALID.replace("-01", "-00").into_bytes()).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn anything_but_a_strict_version_00_is_invalid() {
        let zero_trace = format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32));
        let zero_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        for invalid in [
            VALID.to_uppercase(),
            VALID.replacen("00-", "01-", 1),
            VALID.replacen("00-", "ff-", 1),
            format!("{VALID}-extra"),
            VALID[..54].to_owned(),
            VALID.replace('-', "_"),
            VALID.replacen("4bf9", "4bg9", 1),
            VALID.replacen("4bf9", "4BF9", 1),
            VALID.replacen("-01", "-0x", 1),
            zero_trace,
            zero_span.to_owned(),
            String::new(),
            format!(" {}", &VALID[1..]),
        ] {
            assert_eq!(TraceParent::parse(invalid.as_bytes()), None, "{invalid:?}");
        }
    }

    #[test]
    fn two_headers_are_invalid() {
        let mut headers = HeaderMap::new();
        headers.append(TRACEPARENT, HeaderValue::from_static(VALID));
        assert!(TraceParent::from_headers(&headers).is_some());
        headers.append(TRACEPARENT, HeaderValue::from_static(VALID));
        assert_eq!(TraceParent::from_headers(&headers), None);
    }

    #[test]
    fn minted_ids_differ_and_tags_are_stable_per_key() {
        let minter = Minter::new();
        assert_ne!(minter.span_id(), minter.span_id());
        assert_ne!(minter.trace_id(), minter.trace_id());
        let tag = minter.session_tag(b"session");
        assert_eq!(tag.len(), 16);
        assert_eq!(tag, minter.session_tag(b"session"));
        assert_ne!(tag, minter.session_tag(b"other"));
        assert_ne!(tag, Minter::new().session_tag(b"session"));
    }
}
