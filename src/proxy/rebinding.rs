//! DNS-rebinding protection: which `Host` and `Origin` values are served.
//!
//! A web page from `http://evil.example` can make the victim's browser send
//! requests to a server on the victim's loopback interface by pointing its own
//! DNS name at `127.0.0.1` after the page loaded ("rebinding"). The browser
//! still believes it talks to `evil.example`, so the request carries
//! `Host: evil.example:<port>` and, on a POST, `Origin: http://evil.example:<port>`.
//! Checking both against the names the server is really reached by stops it,
//! which is what the MCP SDKs do (python-sdk's `TransportSecuritySettings`,
//! rmcp's `allowed_hosts`). The proxy sets `Host` to the upstream's own
//! authority, so the upstream's check can no longer see the browser's `Host`:
//! the proxy has to check it itself, before anything else.

use std::fmt;
use std::sync::Arc;

use http::header::{HOST, ORIGIN};
use http::{Request, Response, StatusCode};

use super::body::ProxyBody;
use crate::throttle::Throttle;
use crate::wire::answer;

/// Host names a loopback listener answers to by default (any port).
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Why a host or origin pattern was refused by [`HostPolicy`].
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
struct HostPattern {
    /// Lower case; IPv6 literals keep their brackets.
    host: String,
    port: Option<u16>,
}

impl HostPattern {
    /// `name`, `name:port` or `name:*`; IPv6 literals in brackets.
    fn parse(pattern: &str) -> Result<Self, InvalidPattern> {
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

    fn matches(&self, host: &str, port: Option<u16>) -> bool {
        self.host.eq_ignore_ascii_case(host) && (self.port.is_none() || self.port == port)
    }
}

/// `scheme://host[:port]` (port `*` for any), or the literal `null`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OriginPattern {
    /// Lower case; empty for `null`.
    scheme: String,
    host: HostPattern,
}

impl OriginPattern {
    fn parse(pattern: &str) -> Result<Self, InvalidPattern> {
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

    fn matches(&self, origin: &Origin<'_>) -> bool {
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
enum Origin<'a> {
    Null,
    Tuple {
        scheme: &'a str,
        host: &'a str,
        port: Option<u16>,
    },
}

impl<'a> Origin<'a> {
    fn parse(value: &'a str) -> Option<Self> {
        if value == "null" {
            return Some(Self::Null);
        }
        let (scheme, rest) = value.split_once("://")?;
        let (host, port) = split_host_port(rest)?;
        Some(Self::Tuple { scheme, host, port })
    }

    fn is_loopback(&self) -> bool {
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
fn split_host_port(text: &str) -> Option<(&str, Option<u16>)> {
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

fn is_loopback_host(host: &str) -> bool {
    // The length picks the one name to compare (`localhost` and `127.0.0.1`
    // share theirs; only letters have a case).
    match host.len() {
        9 => host == LOOPBACK_HOSTS[1] || host.eq_ignore_ascii_case(LOOPBACK_HOSTS[0]),
        5 => host == LOOPBACK_HOSTS[2],
        _ => false,
    }
}

#[derive(Debug, Clone)]
enum Allowed<T> {
    Any,
    Loopback,
    Listed(Vec<T>),
}

/// Which `Host` (or HTTP/2 `:authority`) and `Origin` values the proxy serves:
/// its DNS-rebinding protection. See [`check`](Self::check).
///
/// The default, [`HostPolicy::loopback`], is right for a proxy listening on a
/// loopback address: `localhost`, `127.0.0.1` and `[::1]` on any port, and
/// requests without `Origin` or with an `http`/`https` origin on one of those
/// hosts. A proxy reachable under other names lists them.
///
/// ```
/// use mcp_id_guard::proxy::HostPolicy;
///
/// let policy = HostPolicy::loopback();
/// let rebound = http::Request::post("/mcp")
///     .header("host", "evil.example:8080")
///     .header("origin", "http://evil.example:8080")
///     .body(())?;
/// let refusal = policy.check(&rebound).unwrap_err();
/// assert_eq!(refusal.status(), 421);
///
/// let named = HostPolicy::loopback()
///     .allowed_hosts(["mcp.internal:8080"])?
///     .allowed_origins(["https://app.example.com"])?;
/// let request = http::Request::post("/mcp")
///     .header("host", "mcp.internal:8080")
///     .header("origin", "https://app.example.com")
///     .body(())?;
/// assert!(named.check(&request).is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct HostPolicy {
    hosts: Allowed<HostPattern>,
    origins: Allowed<OriginPattern>,
    log: Arc<RefusalLog>,
}

impl Default for HostPolicy {
    fn default() -> Self {
        Self::loopback()
    }
}

impl HostPolicy {
    /// Loopback host names on any port, and loopback origins (or none).
    pub fn loopback() -> Self {
        Self {
            hosts: Allowed::Loopback,
            origins: Allowed::Loopback,
            log: Arc::default(),
        }
    }

    /// No checks at all: every `Host` and `Origin` passes. Only for a proxy
    /// behind something else that checks them.
    pub fn allow_any() -> Self {
        Self::loopback().any_host().any_origin()
    }

    /// Serves only these host names, instead of the loopback ones: each is
    /// `name` or `name:*` (any port), or `name:port`; IPv6 literals in
    /// brackets (`[::1]:8080`). Case does not matter.
    ///
    /// # Errors
    /// When a pattern is not a host name with an optional port.
    pub fn allowed_hosts<I, S>(mut self, hosts: I) -> Result<Self, InvalidPattern>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let hosts = hosts
            .into_iter()
            .map(|host| HostPattern::parse(host.as_ref()))
            .collect::<Result<_, _>>()?;
        self.hosts = Allowed::Listed(hosts);
        Ok(self)
    }

    /// Serves requests with any `Host`.
    pub fn any_host(mut self) -> Self {
        self.hosts = Allowed::Any;
        self
    }

    /// Serves only requests whose `Origin` is one of these (requests without
    /// `Origin`, from programs rather than browsers, always pass), instead of
    /// the loopback origins: `scheme://host`, `scheme://host:port` or
    /// `scheme://host:*`, or `null`. A host without a port matches any port.
    ///
    /// # Errors
    /// When a pattern is not an origin.
    pub fn allowed_origins<I, S>(mut self, origins: I) -> Result<Self, InvalidPattern>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let origins = origins
            .into_iter()
            .map(|origin| OriginPattern::parse(origin.as_ref()))
            .collect::<Result<_, _>>()?;
        self.origins = Allowed::Listed(origins);
        Ok(self)
    }

    /// Serves requests with any `Origin`.
    pub fn any_origin(mut self) -> Self {
        self.origins = Allowed::Any;
        self
    }

    /// Whether a request may pass: its `Host` (or, when the request target
    /// carries one, as HTTP/2 requests do, its authority) names an allowed
    /// host, and it has no `Origin` or an allowed one. A request without a
    /// host, or with two `Host` or two `Origin` headers, is refused.
    ///
    /// # Errors
    /// The refusal to answer with: `421 Misdirected Request` for the host,
    /// `403 Forbidden` for the origin, as the MCP SDKs answer. Refusals are
    /// logged at most once per 10 s per kind, with the count since the last
    /// line.
    pub fn check<B>(&self, request: &Request<B>) -> Result<(), Refusal> {
        if !matches!(self.hosts, Allowed::Any) {
            let host = request_host(request);
            let allowed =
                host.and_then(split_host_port)
                    .is_some_and(|(host, port)| match &self.hosts {
                        Allowed::Any => true,
                        Allowed::Loopback => is_loopback_host(host),
                        Allowed::Listed(patterns) => patterns.iter().any(|p| p.matches(host, port)),
                    });
            if !allowed {
                let shown = host.unwrap_or("(none)");
                self.log.refused(RefusalKind::Host, shown);
                return Err(Refusal {
                    kind: RefusalKind::Host,
                });
            }
        }
        if !matches!(self.origins, Allowed::Any) {
            let mut values = request.headers().get_all(ORIGIN).iter();
            if let Some(value) = values.next() {
                let text = value.to_str().ok();
                let allowed = values.next().is_none()
                    && text
                        .and_then(Origin::parse)
                        .is_some_and(|origin| match &self.origins {
                            Allowed::Any => true,
                            Allowed::Loopback => origin.is_loopback(),
                            Allowed::Listed(patterns) => {
                                patterns.iter().any(|p| p.matches(&origin))
                            }
                        });
                if !allowed {
                    self.log
                        .refused(RefusalKind::Origin, text.unwrap_or("(not text)"));
                    return Err(Refusal {
                        kind: RefusalKind::Origin,
                    });
                }
            }
        }
        Ok(())
    }
}

/// The host a request names: the request target's authority (absolute-form
/// targets, HTTP/2 `:authority`), else its only `Host` header.
fn request_host<B>(request: &Request<B>) -> Option<&str> {
    let mut hosts = request.headers().get_all(HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return None;
    }
    if let Some(authority) = request.uri().authority() {
        return Some(authority.as_str());
    }
    header?.to_str().ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefusalKind {
    Host,
    Origin,
}

/// A request refused by [`HostPolicy::check`].
#[derive(Debug)]
pub struct Refusal {
    kind: RefusalKind,
}

impl Refusal {
    /// `421 Misdirected Request` (host) or `403 Forbidden` (origin).
    pub fn status(&self) -> StatusCode {
        match self.kind {
            RefusalKind::Host => StatusCode::MISDIRECTED_REQUEST,
            RefusalKind::Origin => StatusCode::FORBIDDEN,
        }
    }

    /// The answer: the status and a JSON-RPC `-32600` error with a `null` id
    /// (the body has not been read).
    pub fn into_response(self) -> Response<ProxyBody> {
        let message = match self.kind {
            RefusalKind::Host => "Invalid Request: Host not allowed (DNS-rebinding protection)",
            RefusalKind::Origin => "Invalid Request: Origin not allowed (DNS-rebinding protection)",
        };
        answer::single(self.status(), "null", answer::INVALID_REQUEST, message)
            .map(ProxyBody::local)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            RefusalKind::Host => f.write_str("Host not allowed"),
            RefusalKind::Origin => f.write_str("Origin not allowed"),
        }
    }
}

impl std::error::Error for Refusal {}

/// Logs refusals at most once per interval per kind ([`Throttle`]): a rebinding page
/// can send thousands of requests, and each would otherwise be a log line.
#[derive(Debug, Default)]
struct RefusalLog(Throttle<2>);

impl RefusalLog {
    fn refused(&self, kind: RefusalKind, value: &str) {
        let Some(suppressed) = self.0.ready(kind as usize) else {
            return;
        };
        // The value comes from a possibly hostile client: bounded and escaped.
        let shown: String = value.chars().take(80).collect();
        let (what, answer) = match kind {
            RefusalKind::Host => ("Host", 421),
            RefusalKind::Origin => ("Origin", 403),
        };
        tracing::warn!(
            "refused a request with {what} {shown:?} ({answer}; DNS-rebinding protection); {suppressed} more refused since the last such line; allow names with --allowed-hosts / --allowed-origins",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: Option<&str>, origin: Option<&str>) -> Request<()> {
        let mut builder = Request::post("/mcp");
        if let Some(host) = host {
            builder = builder.header(HOST, host);
        }
        if let Some(origin) = origin {
            builder = builder.header(ORIGIN, origin);
        }
        builder.body(()).unwrap()
    }

    fn status(policy: &HostPolicy, host: Option<&str>, origin: Option<&str>) -> u16 {
        match policy.check(&request(host, origin)) {
            Ok(()) => 200,
            Err(refusal) => refusal.status().as_u16(),
        }
    }

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
    fn loopback_default() {
        let policy = HostPolicy::loopback();
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1:1",
            "[::1]:8080",
            "[::1]",
        ] {
            assert_eq!(status(&policy, Some(host), None), 200, "{host}");
        }
        for host in [
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.2",
            "::1",
            "user@localhost",
            "",
            "localhost:notaport",
        ] {
            assert_eq!(status(&policy, Some(host), None), 421, "{host}");
        }
        assert_eq!(status(&policy, None, None), 421);
        for origin in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:5173",
        ] {
            assert_eq!(
                status(&policy, Some("localhost"), Some(origin)),
                200,
                "{origin}"
            );
        }
        for origin in [
            "http://evil.example:8080",
            "null",
            "file://",
            "ws://localhost",
            "http://localhost/path",
            "localhost",
            "http://localhost.evil.example",
        ] {
            assert_eq!(
                status(&policy, Some("localhost"), Some(origin)),
                403,
                "{origin}"
            );
        }
    }

    #[test]
    fn two_hosts_or_origins_are_refused() {
        let policy = HostPolicy::loopback();
        let mut twice = request(Some("localhost"), None);
        twice
            .headers_mut()
            .append(HOST, "evil.example".parse().unwrap());
        assert_eq!(policy.check(&twice).unwrap_err().status(), 421);
        let mut twice = request(Some("localhost"), Some("http://localhost"));
        twice
            .headers_mut()
            .append(ORIGIN, "http://evil.example".parse().unwrap());
        assert_eq!(policy.check(&twice).unwrap_err().status(), 403);
    }

    #[test]
    fn the_target_authority_wins_over_host() {
        // HTTP/2 requests and absolute-form targets carry the authority.
        let policy = HostPolicy::loopback();
        let request = Request::post("http://evil.example:8080/mcp")
            .header(HOST, "localhost")
            .body(())
            .unwrap();
        assert_eq!(policy.check(&request).unwrap_err().status(), 421);
        let request = Request::post("http://localhost:8080/mcp").body(()).unwrap();
        assert!(policy.check(&request).is_ok());
    }

    #[test]
    fn listed_names() {
        let policy = HostPolicy::loopback()
            .allowed_hosts(["mcp.example.com", "gw.internal:8443", "[::1]:*"])
            .unwrap()
            .allowed_origins(["https://app.example.com", "http://localhost:*", "null"])
            .unwrap();
        assert_eq!(status(&policy, Some("MCP.example.com:1234"), None), 200);
        assert_eq!(status(&policy, Some("gw.internal:8443"), None), 200);
        assert_eq!(status(&policy, Some("gw.internal:8444"), None), 421);
        assert_eq!(status(&policy, Some("gw.internal"), None), 421);
        assert_eq!(status(&policy, Some("[::1]:9"), None), 200);
        // The listed names replace the loopback ones.
        assert_eq!(status(&policy, Some("localhost"), None), 421);
        let host = Some("mcp.example.com");
        assert_eq!(status(&policy, host, Some("https://app.example.com")), 200);
        assert_eq!(
            status(&policy, host, Some("https://app.example.com:443")),
            200
        );
        assert_eq!(status(&policy, host, Some("http://app.example.com")), 403);
        assert_eq!(status(&policy, host, Some("http://localhost:5173")), 200);
        assert_eq!(status(&policy, host, Some("null")), 200);
        assert_eq!(status(&policy, host, Some("https://evil.example")), 403);

        let open = HostPolicy::allow_any();
        assert_eq!(status(&open, None, Some("null")), 200);
        assert_eq!(
            status(&open, Some("evil.example"), Some("http://evil.example")),
            200
        );
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

    #[test]
    fn refusals_are_json_rpc_errors() {
        let response = HostPolicy::loopback()
            .check(&request(Some("evil.example"), None))
            .unwrap_err()
            .into_response();
        assert_eq!(response.status(), 421);
        assert_eq!(response.headers()["content-type"], "application/json");
    }
}
