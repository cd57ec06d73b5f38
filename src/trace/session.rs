//! `mcp.session.id`: a keyed hash of the session id, never the id.

use std::hash::Hasher;
use std::sync::OnceLock;

use siphasher::sip::SipHasher13;

use crate::wire::id::random_word;

/// 16 hex digits of SipHash-1-3 of the session id under this process's
/// random key. Session ids are bearer secrets in some servers: a key an
/// attacker with the trace store does not have means a guessed id cannot
/// be confirmed offline. The price: the tag of one session differs across
/// restarts and replicas.
pub(crate) fn session_tag(session: &[u8]) -> String {
    static KEY: OnceLock<(u64, u64)> = OnceLock::new();
    let key = KEY.get_or_init(|| (random_word(13), random_word(14)));
    let mut hasher = SipHasher13::new_with_keys(key.0, key.1);
    hasher.write(session);
    format!("{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_16_hex_digits_stable_and_distinct() {
        let tag = session_tag(b"session");
        assert_eq!(tag.len(), 16);
        assert!(tag.bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert_eq!(tag, session_tag(b"session"));
        assert_ne!(tag, session_tag(b"other"));
        assert!(!tag.contains("session"));
    }
}
