//! [`HostPolicy`]: which `Host` and `Origin` values are served (see the
//! [module docs](super) for why).

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HOST, ORIGIN};
use http::{Request, Response};
use http_body_util::Full;

use super::pattern::{
    is_loopback_host, split_host_port, HostPattern, InvalidPattern, Origin, OriginPattern,
};
use crate::protect::refused::Refused;
use crate::throttle::Throttle;
use crate::wire::answer;

#[derive(Debug, Clone)]
enum Allowed<T> {
    Any,
    Loopback,
    Listed(Vec<T>),
}

/// Which `Host` (or HTTP/2 `:authority`) and `Origin` values are served: the
/// DNS-rebinding protection that [`HostLayer`](super::HostLayer) applies. See
/// [`check`](Self::check).
///
/// The default, [`HostPolicy::loopback`], is right for a server listening on a
/// loopback address: `localhost`, `127.0.0.1` and `[::1]` on any port, and
/// requests without `Origin` or with an `http`/`https` origin on one of those
/// hosts. A server reachable under other names lists them.
///
/// ```
/// use mcp_id_guard::protect::host::HostPolicy;
/// use mcp_id_guard::protect::Refused;
///
/// let policy = HostPolicy::loopback();
/// let rebound = http::Request::post("/mcp")
///     .header("host", "evil.example:8080")
///     .header("origin", "http://evil.example:8080")
///     .body(())?;
/// assert_eq!(policy.check(&rebound), Err(Refused::Host));
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
    /// The kind of refusal: [`Refused::Host`] (which [`HostLayer`](super::HostLayer)
    /// answers with `421 Misdirected Request`) or [`Refused::Origin`] (`403
    /// Forbidden`), as the MCP SDKs answer. Refusals are logged at most once
    /// per 10 s per kind, with the count since the last line.
    pub fn check<B>(&self, request: &Request<B>) -> Result<(), Refused> {
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
                self.log.refused(Refused::Host, shown);
                return Err(Refused::Host);
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
                        .refused(Refused::Origin, text.unwrap_or("(not text)"));
                    return Err(Refused::Origin);
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

/// The answer to a request [`HostPolicy::check`] refused: a JSON-RPC
/// `-32600` error with a `null` id (the body has not been read).
pub(super) fn refusal(kind: Refused) -> Response<Full<Bytes>> {
    match kind {
        Refused::Origin => answer::origin_refused(),
        _ => answer::host_refused(),
    }
}

/// Logs refusals at most once per interval per kind ([`Throttle`]): a rebinding page
/// can send thousands of requests, and each would otherwise be a log line.
#[derive(Debug, Default)]
struct RefusalLog(Throttle<2>);

impl RefusalLog {
    fn refused(&self, kind: Refused, value: &str) {
        let index = usize::from(kind == Refused::Origin);
        let Some(suppressed) = self.0.ready(index) else {
            return;
        };
        // The value comes from a possibly hostile client: bounded and escaped.
        let shown: String = value.chars().take(80).collect();
        let (what, answer) = match kind {
            Refused::Origin => ("Origin", 403),
            _ => ("Host", 421),
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
            Err(kind) => refusal(kind).status().as_u16(),
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
        assert_eq!(policy.check(&twice), Err(Refused::Host));
        let mut twice = request(Some("localhost"), Some("http://localhost"));
        twice
            .headers_mut()
            .append(ORIGIN, "http://evil.example".parse().unwrap());
        assert_eq!(policy.check(&twice), Err(Refused::Origin));
    }

    #[test]
    fn the_target_authority_wins_over_host() {
        // HTTP/2 requests and absolute-form targets carry the authority.
        let policy = HostPolicy::loopback();
        let request = Request::post("http://evil.example:8080/mcp")
            .header(HOST, "localhost")
            .body(())
            .unwrap();
        assert_eq!(policy.check(&request), Err(Refused::Host));
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
    fn refusals_are_json_rpc_errors() {
        let kind = HostPolicy::loopback()
            .check(&request(Some("evil.example"), None))
            .unwrap_err();
        let response = refusal(kind);
        assert_eq!(response.status(), 421);
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(refusal(Refused::Origin).status(), 403);
    }
}
