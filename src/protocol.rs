//! Facts of the MCP streamable-HTTP transport that the guard and the proxy
//! both read off requests and responses: header names, protocol revisions,
//! media types.

use http::header::{HeaderName, CONTENT_TYPE};
use http::HeaderMap;

/// The session header of the legacy streamable-HTTP revisions (2025-03-26 to
/// 2025-11-25). Header names are case-insensitive.
pub(crate) static MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
pub(crate) static MCP_PROTOCOL_VERSION: HeaderName =
    HeaderName::from_static("mcp-protocol-version");

/// The first protocol revision without sessions (2026-07-28): each response
/// comes back on its own POST there, so ids cannot cross-wire.
const FIRST_SESSIONLESS_REVISION: &str = "2026-07-28";

/// Revisions are dates (`YYYY-MM-DD`), which order as strings.
pub(crate) fn is_sessionless_revision(version: &[u8]) -> bool {
    let Some(date) = version.get(..10) else {
        return false;
    };
    let shaped = date.iter().enumerate().all(|(index, byte)| match index {
        4 | 7 => *byte == b'-',
        _ => byte.is_ascii_digit(),
    });
    shaped && date >= FIRST_SESSIONLESS_REVISION.as_bytes()
}

/// The media type of a `Content-Type` value, without parameters.
pub(crate) fn media_type(value: &str) -> &str {
    value.split(';').next().unwrap_or_default().trim()
}

/// Whether `headers` declare `media` as the content type (parameters and case
/// ignored).
pub(crate) fn has_media_type(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| media_type(value).eq_ignore_ascii_case(media))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions() {
        assert!(is_sessionless_revision(b"2026-07-28"));
        assert!(is_sessionless_revision(b"2027-01-01"));
        assert!(!is_sessionless_revision(b"2025-06-18"));
        assert!(!is_sessionless_revision(b"draft"));
        assert!(!is_sessionless_revision(b"9999"));
    }
}
