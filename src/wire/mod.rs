//! Bytes on the wire: the JSON scanner, the JSON-RPC envelope it reads, ids
//! and their server-side form, the edits that splice them, restoring client
//! ids in responses (JSON and SSE), the protocol's facts, and the one
//! builder of the guard's own JSON-RPC answers. Nothing here knows about
//! sessions or services.

pub(crate) mod answer;
pub(crate) mod edit;
pub(crate) mod envelope;
pub(crate) mod id;
pub(crate) mod method;
pub(crate) mod protocol;
pub(crate) mod restore;
pub(crate) mod scan;
pub(crate) mod sse;

/// The byte a percent escape's two hex digits spell (either case), for the
/// decoder of URL paths: `None` unless both are hex digits.
#[cfg(feature = "proxy")]
pub(crate) fn percent_byte(high: u8, low: u8) -> Option<u8> {
    let digit = |byte: u8| char::from(byte).to_digit(16);
    u8::try_from(digit(high)? * 16 + digit(low)?).ok()
}
