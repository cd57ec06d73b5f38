//! Request ids: when two ids collide, and the self-describing server-side ids
//! that remapping forwards instead.
//!
//! # Equivalence
//! Two ids collide when their decoded values are equal, and an integer `n` also
//! collides with the string `"n"`: the Python SDK routes by `str(id)`, so `1` and
//! `"1"` share one routing slot there. The key of a string id is its decoded text
//! (`"\u0031"` is `1`); the key of an integer is its decimal text (`-0` is `0`);
//! any other id (a fraction, an exponent, a non-scalar, none of them valid MCP
//! ids) is keyed by its exact JSON text.
//!
//! # Remapped ids
//! A remapped id is a JSON string `"mcp-id-guard:<tag>:<counter>:<original>"`
//! where `<tag>` is a random per-layer instance tag (so ids from several guard
//! replicas in front of one server never collide), `<counter>` makes it unique
//! within the instance, and `<original>` is the client's id exactly as it was
//! written. Restoring therefore needs no lookup table, works for any replica and
//! gives back the original bytes.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::value::RawValue;

/// The reserved prefix of server-side ids. Client ids that start with it are
/// always rewritten, so restoring unwraps exactly one level.
pub(crate) const RESERVED_PREFIX: &str = "mcp-id-guard:";

/// The collision key of an id; see the module docs for the equivalence.
pub(crate) type IdKey = Box<str>;

/// Computes the collision key of an id's JSON text.
pub(crate) fn id_key(raw: &str) -> IdKey {
    id_key_text(raw).into()
}

/// The collision key of an id's JSON text, borrowed from it whenever it can
/// be (the key of `7` is `7`, of `"abc"` is `abc`): the session table looks
/// up every request's id, and most of them are never stored.
pub(crate) fn id_key_text(raw: &str) -> Cow<'_, str> {
    if raw.starts_with('"') {
        if let Ok(decoded) = serde_json::from_str::<Cow<'_, str>>(raw) {
            return decoded;
        }
    } else if is_integer(raw) {
        let digits = raw.trim_start_matches('-');
        if digits.bytes().all(|digit| digit == b'0') {
            return Cow::Borrowed("0");
        }
    }
    Cow::Borrowed(raw)
}

fn is_integer(raw: &str) -> bool {
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit())
}

/// Whether an id key is in the reserved namespace (a forged or replayed
/// server-side id coming from a client).
pub(crate) fn is_reserved(key: &str) -> bool {
    key.starts_with(RESERVED_PREFIX)
}

/// Mints server-side ids for one layer instance.
#[derive(Debug)]
pub(crate) struct IdMinter {
    tag: String,
    counter: AtomicU64,
}

impl IdMinter {
    pub(crate) fn new() -> Self {
        // `RandomState` is seeded from the OS per process and varies per
        // instance; mixing in the time and pid separates processes started from
        // one image with the same seed source.
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        if let Ok(since_epoch) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)
        {
            hasher.write_u128(since_epoch.as_nanos());
        }
        Self {
            tag: format!("{:016x}", hasher.finish()),
            counter: AtomicU64::new(0),
        }
    }

    /// The JSON text of a fresh server-side id carrying `original` (the
    /// client's id JSON text) inside it.
    pub(crate) fn mint(&self, original: &str) -> Vec<u8> {
        let serial = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::with_capacity(RESERVED_PREFIX.len() + original.len() + 48);
        out.push(b'"');
        out.extend_from_slice(RESERVED_PREFIX.as_bytes());
        out.extend_from_slice(self.tag.as_bytes());
        out.push(b':');
        out.extend_from_slice(serial.to_string().as_bytes());
        out.push(b':');
        escape_into(&mut out, original);
        out.push(b'"');
        out
    }
}

/// Appends `text` as the inside of a JSON string literal.
fn escape_into(out: &mut Vec<u8>, text: &str) {
    for &byte in text.as_bytes() {
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            // Whitespace inside a non-scalar id's JSON text (newlines, tabs).
            0x00..=0x1f => out.extend_from_slice(format!("\\u{byte:04x}").as_bytes()),
            _ => out.push(byte),
        }
    }
}

/// If `raw` (an id's JSON text) is a server-side id minted by any guard
/// instance, returns the client's original id JSON text carried inside it.
///
/// Only ids written the way guards write them, with the prefix spelled out
/// literally, are restored: servers echo ids as they received them, and this
/// keeps the SSE rewriter's fast path (a search for the literal prefix) exact,
/// so its output never depends on how the stream was chunked.
pub(crate) fn restore(raw: &str) -> Option<String> {
    if !raw
        .strip_prefix('"')
        .is_some_and(|inside| inside.starts_with(RESERVED_PREFIX))
    {
        return None;
    }
    let decoded = serde_json::from_str::<Cow<'_, str>>(raw).ok()?;
    let rest = decoded.strip_prefix(RESERVED_PREFIX)?;
    let (tag, rest) = rest.split_once(':')?;
    let (serial, original) = rest.split_once(':')?;
    let well_formed = tag.len() == 16
        && tag.bytes().all(|byte| byte.is_ascii_hexdigit())
        && !serial.is_empty()
        && serial.bytes().all(|byte| byte.is_ascii_digit());
    if !well_formed {
        return None;
    }
    // Only give back something that is itself one whole JSON value.
    let value = serde_json::from_str::<&RawValue>(original).ok()?;
    (value.get().len() == original.len()).then(|| original.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equivalence() {
        assert_eq!(id_key("1"), id_key(r#""1""#));
        assert_eq!(id_key(r#""\u0031""#), id_key("1"));
        assert_eq!(id_key("-0"), id_key("0"));
        assert_eq!(id_key("-00"), id_key("0"));
        assert_ne!(id_key("1"), id_key("2"));
        assert_ne!(id_key("1.0"), id_key("1"));
        assert_eq!(&*id_key("1e3"), "1e3");
        assert_eq!(
            &*id_key("123456789012345678901234567890"),
            "123456789012345678901234567890"
        );
    }

    #[test]
    fn minted_ids_round_trip_byte_for_byte() {
        let minter = IdMinter::new();
        for original in [
            "1",
            r#""\u0031""#,
            r#""a\"b\\c""#,
            "-0",
            "1e3",
            "{\"a\":\n[1, 2]}",
            r#""ü""#,
        ] {
            let minted = String::from_utf8(minter.mint(original)).unwrap();
            let decoded: String =
                serde_json::from_str(&minted).expect("minted id is a JSON string");
            assert!(is_reserved(&decoded));
            assert_eq!(restore(&minted).as_deref(), Some(original), "{minted}");
        }
    }

    #[test]
    fn minted_ids_are_unique_and_tags_differ_per_instance() {
        let (a, b) = (IdMinter::new(), IdMinter::new());
        assert_ne!(a.mint("1"), a.mint("1"));
        assert_ne!(a.tag, b.tag);
    }

    #[test]
    fn restore_unwraps_exactly_one_level() {
        let minter = IdMinter::new();
        let inner = String::from_utf8(minter.mint("7")).unwrap();
        let outer = String::from_utf8(minter.mint(&inner)).unwrap();
        assert_eq!(restore(&outer).as_deref(), Some(inner.as_str()));
    }

    #[test]
    fn restore_ignores_lookalikes() {
        for raw in [
            "1",
            r#""plain""#,
            r#""mcp-id-guard:""#,
            r#""mcp-id-guard:zz:1:1""#,
            r#""mcp-id-guard:0123456789abcdef::1""#,
            r#""mcp-id-guard:0123456789abcdef:1:""#,
            r#""mcp-id-guard:0123456789abcdef:1:1 ""#,
            r#""mcp-id-guard:0123456789abcdef:1:{""#,
            r#""\u006dcp-id-guard:0123456789abcdef:1:7""#,
        ] {
            assert_eq!(restore(raw), None, "{raw}");
        }
    }
}
