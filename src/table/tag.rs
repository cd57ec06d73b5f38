//! The one tag of a session in logs and traces: session ids are bearer
//! secrets in some servers and are never written raw, yet an operator must
//! be able to join a log line to the trace of the same session.
//!
//! The tag is a keyed hash of the table's own hash of the session id, both
//! keys drawn once per process: every table shares them, so the table's log
//! lines (which keep only the hash) and the trace layer (which has the id)
//! name a session alike, hashing 8 bytes, and only when a line is written.
//! An attacker with the log or trace store cannot confirm a guessed session
//! id offline without the keys, nor learn the table's hashes (the trace layer
//! tags any session id a client sends: an untagged hash would let a client
//! who reads the trace store look up the table's hash of strings of its
//! choosing). The price: a session's tag differs across restarts and
//! replicas.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher as _;
use std::sync::OnceLock;

/// The process's session hasher: every table hashes session ids with a
/// clone of it (clones share the key).
pub(super) fn hasher() -> &'static RandomState {
    static HASHER: OnceLock<RandomState> = OnceLock::new();
    HASHER.get_or_init(RandomState::new)
}

/// The key of the tags themselves, apart from the table's.
fn tag_hasher() -> &'static RandomState {
    static HASHER: OnceLock<RandomState> = OnceLock::new();
    HASHER.get_or_init(RandomState::new)
}

/// A session's tag in logs and traces: 16 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionTag(u64);

impl SessionTag {
    /// The tag of a session id (the trace layer has the id, not its hash).
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn of(session: &[u8]) -> Self {
        Self::of_hash(hasher().hash_one(session))
    }

    /// The tag of a session whose hash the table keeps.
    pub(super) fn of_hash(hash: u64) -> Self {
        Self(tag_hasher().hash_one(hash))
    }
}

impl fmt::Display for SessionTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_16_hex_digits_stable_and_distinct() {
        let tag = SessionTag::of(b"session").to_string();
        assert_eq!(tag.len(), 16);
        assert!(tag.bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert_eq!(tag, SessionTag::of(b"session").to_string());
        assert_ne!(tag, SessionTag::of(b"other").to_string());
        assert!(!tag.contains("session"));
    }

    #[test]
    fn a_table_names_a_session_as_the_trace_layer_does() {
        let table = crate::table::Table::new();
        assert_eq!(table.session_tag(b"session"), SessionTag::of(b"session"));
    }

    #[test]
    fn a_tag_is_not_the_tables_hash() {
        let hash = hasher().hash_one(b"session".as_slice());
        assert_ne!(SessionTag::of(b"session").0, hash);
    }
}
