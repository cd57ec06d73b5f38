//! The patterns of a [`HostPolicy`](super::HostPolicy): host names with an
//! optional port, origins, and the parsing of the `Host` and `Origin` values
//! requests carry.

use std::fmt;

/// Host names a loopback listener answers to by default (any port).
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Why a host or origin pattern was refused by [`HostPolicy`](super::HostPolicy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPattern {
    pattern: String,
    reason: &'static str,
}

impl fmt::Display for InvalidPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid pattern {:?}: {}", self.pattern, self.reason)
    }
}

impl std::error::Error for InvalidPattern {}

/// A host name with an optional port; `None` matches any port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HostPattern {
    /// Lower case; IPv6 literals keep their brackets.
    host: String,
    port: Option<u16>,
}

impl HostPattern {
    /// `name`, `name:port` or `name:*`; IPv6 literals in brackets.
    pub(super) fn parse(pattern: &str) -> Result<Self, InvalidPattern> {
        let invalid = |reason| InvalidPattern {
            pattern: pattern.to_owned(),
            reason,
        };
        let trimmed = pattern.trim();
        let (name, any_port) = match trimmed.strip_suffix(":*") {
            Some(name) => (name, true),
            None => (trimmed, false),
        };
        let (host, port) =
            split_host_port(name).ok_or_else(|| invalid("not a host name, host:port or host:*"))?;
        if any_port && port.is_some() {
            return Err(invalid("two ports"));
        }
        Ok(Self {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    pub(super) fn matches(&self, host: &str, port: Option<u16>) -> bool {
        self.host.eq_ignore_ascii_case(host) && (self.port.is_none() || self.port == port)
    }
}

/// `scheme://host[:port]` (port `*` for any), or the literal `null`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OriginPattern {
    /// Lower case; empty for `null`.
    scheme: String,
    host: HostPattern,
}

impl OriginPattern {
    pub(super) fn parse(pattern: &str) -> Result<Self, InvalidPattern> {
        let trimmed = pattern.trim();
        if trimmed.eq_ignore_ascii_case("null") {
            return Ok(Self::null());
        }
        let invalid = |reason| InvalidPattern {
            pattern: pattern.to_owned(),
            reason,
        };
        let (scheme, rest) = trimmed.split_once("://").ok_or_else(|| {
            invalid("an origin is scheme://host[:port], such as http://localhost:3000")
        })?;
        if scheme.is_empty()
            || !scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        {
            return Err(invalid("not a URL scheme"));
        }
        if rest.contains('/') {
            return Err(invalid("an origin has no path"));
        }
        Ok(Self {
            scheme: scheme.to_ascii_lowercase(),
            host: HostPattern::parse(rest)
                .map_err(|_| invalid("not a host, host:port or host:*"))?,
        })
    }

    fn null() -> Self {
        Self {
            scheme: String::new(),
            host: HostPattern {
                host: String::new(),
                port: None,
            },
        }
    }

    pub(super) fn matches(&self, origin: &Origin<'_>) -> bool {
        match origin {
            Origin::Null => self.scheme.is_empty(),
            Origin::Tuple { scheme, host, port } => {
                !self.scheme.is_empty()
                    && self.scheme.eq_ignore_ascii_case(scheme)
                    && self.host.matches(host, *port)
            }
        }
    }
}

/// A request's `Origin` header, parsed.
pub(super) enum Origin<'a> {
    Null,
    Tuple {
        scheme: &'a str,
        host: &'a str,
        port: Option<u16>,
    },
}

impl<'a> Origin<'a> {
    pub(super) fn parse(value: &'a str) -> Option<Self> {
        if value == "null" {
            return Some(Self::Null);
        }
        let (scheme, rest) = value.split_once("://")?;
        let (host, port) = split_host_port(rest)?;
        Some(Self::Tuple { scheme, host, port })
    }

    pub(super) fn is_loopback(&self) -> bool {
        match self {
            Self::Null => false,
            Self::Tuple { scheme, host, .. } => {
                (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
                    && is_loopback_host(host)
            }
        }
    }
}

/// Splits `host[:port]` (IPv6 literals in brackets) and checks both: a
/// registered name or IPv4 address of letters, digits, `-`, `.` and `_`, or a
/// bracketed IPv6 literal; a port of 1 to 5 digits up to 65535.
pub(super) fn split_host_port(text: &str) -> Option<(&str, Option<u16>)> {
    if text.starts_with('[') {
        return split_bracketed(text);
    }
    // Every request's `Host` comes here: one pass over the bytes, the port
    // read as its digits go by.
    let bytes = text.as_bytes();
    let colon = bytes.iter().position(|&b| !HOST_BYTES[usize::from(b)]);
    let Some(colon) = colon else {
        return (!text.is_empty()).then_some((text, None));
    };
    if colon == 0 || bytes[colon] != b':' {
        return None;
    }
    let port = port(&bytes[colon + 1..])?;
    Some((&text[..colon], Some(port)))
}

/// The bytes of a registered name or IPv4 address: letters, digits, `-`,
/// `.` and `_` (a table: one load per byte instead of four comparisons).
static HOST_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_';
        byte += 1;
    }
    table
};

/// `[v6]` or `[v6]:port`.
fn split_bracketed(text: &str) -> Option<(&str, Option<u16>)> {
    let end = text.find(']')?;
    let (host, rest) = text.split_at(end + 1);
    let inner = &host[1..host.len() - 1];
    if inner.is_empty()
        || !inner
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
    {
        return None;
    }
    match rest {
        "" => Some((host, None)),
        _ => Some((host, Some(port(rest.strip_prefix(':')?.as_bytes())?))),
    }
}

/// 1 to 5 digits, at most 65535.
fn port(digits: &[u8]) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 {
        return None;
    }
    let mut port: u32 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        port = port * 10 + u32::from(digit - b'0');
    }
    u16::try_from(port).ok()
}

pub(super) fn is_loopback_host(host: &str) -> bool {
    // The length picks the one name to compare (`localhost` and `127.0.0.1`
    // share theirs; only letters have a case).
    match host.len() {
        9 => host == LOOPBACK_HOSTS[1] || host.eq_ignore_ascii_case(LOOPBACK_HOSTS[0]),
        5 => host == LOOPBACK_HOSTS[2],
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How hosts were split first: `split_once` and `parse`. Bracketed
    /// (IPv6) hosts are split as they always were, by `split_bracketed`; its
    /// port goes through the same `port` as the others, which this model
    /// checks against `parse`.
    fn model_split(text: &str) -> Option<(&str, Option<u16>)> {
        if text.starts_with('[') {
            return split_bracketed(text);
        }
        let (host, port) = match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        };
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        {
            return None;
        }
        let port = match port {
            None => None,
            Some(digits) => {
                if digits.is_empty()
                    || digits.len() > 5
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                {
                    return None;
                }
                Some(digits.parse::<u16>().ok()?)
            }
        };
        Some((host, port))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5000))]

        #[test]
        fn splits_match_the_model(
            text in "\\[?[a-zA-Z0-9:._\\-@ \\]\\[é]{0,8}(:[0-9+\\- a:]{0,7})?",
        ) {
            proptest::prop_assert_eq!(split_host_port(&text), model_split(&text));
        }

        #[test]
        fn loopback_names_match_the_model(host in "(?i)localhost|127\\.0\\.0\\.1|\\[::1\\]|[a-z0-9.:\\[\\]]{0,10}") {
            let model = LOOPBACK_HOSTS.iter().any(|name| name.eq_ignore_ascii_case(&host));
            proptest::prop_assert_eq!(is_loopback_host(&host), model);
        }

        #[test]
        fn ports_match_the_model(text in "[a-z.]{0,4}:[0-9]{0,6}") {
            proptest::prop_assert_eq!(split_host_port(&text), model_split(&text));
        }
    }

    #[test]
    fn bad_patterns() {
        for bad in [
            "",
            "a b",
            "host:1:2",
            "host:99999",
            "user@host",
            "host:8080:*",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} accepted");
        }
        for bad in ["localhost", "http://", "http://h/path", "://h", "ht tp://h"] {
            assert!(OriginPattern::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
