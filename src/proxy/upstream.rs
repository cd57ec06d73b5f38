//! The upstream base URL: parsed once, joined with each request's path.

use std::fmt;

use http::header::HOST;
use http::request::Parts;
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{HeaderValue, Method};

use crate::wire::percent_byte;

/// Why an upstream URL was refused by [`Proxy::new`](super::Proxy::new) or
/// [`ProxyBuilder::build`](super::ProxyBuilder::build).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidUpstream {
    url: String,
    reason: &'static str,
}

impl InvalidUpstream {
    fn new(url: &str, reason: &'static str) -> Self {
        Self {
            url: url.to_owned(),
            reason,
        }
    }
}

impl fmt::Display for InvalidUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid upstream URL {:?}: {}", self.url, self.reason)
    }
}

impl std::error::Error for InvalidUpstream {}

/// The URL a request goes to, written out when displayed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Url<'a> {
    authority: &'a Authority,
    target: &'a Uri,
}

impl fmt::Display for Url<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.target)
    }
}

/// A parsed `http://host[:port][/prefix]` base.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    authority: Authority,
    /// The `Host` header the upstream gets: its own authority.
    host: HeaderValue,
    /// The path prefix without a trailing slash; empty for the root.
    prefix: String,
    /// The base as given, normalised, for logs.
    display: String,
    /// `host:port`, the port 80 when the URL names none.
    address: String,
}

impl Upstream {
    pub(crate) fn parse(url: &str) -> Result<Self, InvalidUpstream> {
        let uri: Uri = url
            .parse()
            .map_err(|_| InvalidUpstream::new(url, "not a URL"))?;
        match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => {}
            Some(scheme) if *scheme == Scheme::HTTPS => {
                return Err(InvalidUpstream::new(
                    url,
                    "https upstreams are not supported; run the guard next to the server and reach it over plain http",
                ))
            }
            Some(_) => return Err(InvalidUpstream::new(url, "the scheme must be http")),
            None => {
                return Err(InvalidUpstream::new(
                    url,
                    "an absolute URL is needed, such as http://127.0.0.1:8000/mcp",
                ))
            }
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| InvalidUpstream::new(url, "the URL has no host"))?;
        if authority.as_str().contains('@') {
            return Err(InvalidUpstream::new(
                url,
                "credentials in the URL are not supported; clients' Authorization headers are forwarded",
            ));
        }
        if authority.host().is_empty() {
            return Err(InvalidUpstream::new(url, "the URL has no host"));
        }
        if uri.query().is_some() {
            return Err(InvalidUpstream::new(url, "the URL must not have a query"));
        }
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| InvalidUpstream::new(url, "the host is not a valid Host header"))?;
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let display = format!("http://{authority}{prefix}");
        let address = match authority.port() {
            Some(_) => authority.as_str().to_owned(),
            None => format!("{}:80", authority.host()),
        };
        Ok(Self {
            authority,
            host,
            prefix,
            display,
            address,
        })
    }

    /// The request target (origin form) to send a request for `uri` to: the
    /// prefix, then the request's path and query as the client sent them.
    pub(crate) fn target(&self, uri: Uri) -> Uri {
        let tail = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        if self.prefix.is_empty() && tail.starts_with('/') {
            // The target is the request's own: reused, not parsed again.
            if uri.scheme().is_none() && uri.authority().is_none() {
                return uri;
            }
            return uri
                .path_and_query()
                .cloned()
                .map_or_else(Uri::default, Uri::from);
        }
        // Forms without a leading slash (asterisk form with a method other
        // than `OPTIONS`, whose `OPTIONS *` the proxy answers) get one.
        let slash = if tail.starts_with('/') { "" } else { "/" };
        let mut joined = String::with_capacity(self.prefix.len() + slash.len() + tail.len());
        joined.push_str(&self.prefix);
        joined.push_str(slash);
        joined.push_str(tail);
        // The prefix came from a valid URI and the tail from a valid
        // request target; their concatenation is a valid path. Were it not,
        // the upstream's root.
        PathAndQuery::try_from(joined).map_or_else(|_| Uri::from_static("/"), Uri::from)
    }

    /// The whole URL a request goes to, for log lines: `target` is what
    /// [`target`](Self::target) gave. Written out only if a line is.
    pub(crate) fn url<'a>(&'a self, target: &'a Uri) -> Url<'a> {
        Url {
            authority: &self.authority,
            target,
        }
    }

    /// The upstream's root, where connections go.
    pub(crate) fn base(&self) -> Uri {
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query("/")
            .build()
            .expect("a root URI from a valid authority")
    }

    pub(crate) fn host(&self) -> &HeaderValue {
        &self.host
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.display
    }

    pub(crate) fn address(&self) -> &str {
        &self.address
    }
}

/// Why a request is not forwarded, if it is not (the proxy answers `400`):
/// - `CONNECT` (which the proxy answers `405` before this is asked) and
///   authority-form targets: the proxy is no tunnel, and the target names
///   no path under the upstream.
/// - A path with a `.` or `..` segment, plain or percent-encoded (`%2e`),
///   also between encoded slashes: joined under the upstream's prefix,
///   `/../admin` would name something outside it once the upstream
///   normalises the path. Clients resolve dot segments before sending
///   (RFC 3986 §5.2.4), so only a crafted request has one.
/// - A `Host` header that names another host than the target's authority
///   (absolute-form, HTTP/2 `:authority`): the Host policy checks the
///   authority, but the upstream would see the `Host` (with
///   `preserve_host`, or as `X-Forwarded-Host`).
pub(crate) fn refused(parts: &Parts) -> Option<&'static str> {
    let uri = &parts.uri;
    if parts.method == Method::CONNECT {
        return Some("Bad Request: CONNECT is not served");
    }
    if uri.authority().is_some() && uri.path_and_query().is_none() {
        return Some("Bad Request: authority-form request targets are not served");
    }
    if has_dot_segment(uri.path()) {
        return Some("Bad Request: the path has a dot segment");
    }
    if let Some(authority) = uri.authority() {
        let differs = parts.headers.get_all(HOST).iter().any(|host| {
            !host
                .as_bytes()
                .eq_ignore_ascii_case(authority.as_str().as_bytes())
        });
        if differs {
            return Some(
                "Bad Request: the Host header differs from the request target's authority",
            );
        }
    }
    None
}

/// Whether a path has a `.` or `..` segment, dots and separators (`/`, `\`)
/// plain or percent-encoded.
fn has_dot_segment(path: &str) -> bool {
    // Most paths have neither; those pay one scan.
    if !path.bytes().any(|byte| byte == b'.' || byte == b'%') {
        return false;
    }
    let bytes = path.as_bytes();
    let mut index = 0;
    // Dots in the current segment, or `None` once it has anything else.
    let mut dots = Some(0u8);
    loop {
        let (byte, len) = match bytes.get(index) {
            None => (b'/', 0),
            Some(b'%') => match bytes.get(index + 1..index + 3) {
                Some([high, low]) => (percent_byte(*high, *low).unwrap_or(b'%'), 3),
                _ => (b'%', 1),
            },
            Some(byte) => (*byte, 1),
        };
        match byte {
            b'/' | b'\\' => {
                if matches!(dots, Some(1 | 2)) {
                    return true;
                }
                if len == 0 {
                    return false;
                }
                dots = Some(0);
            }
            b'.' => dots = dots.map(|dots| dots.saturating_add(1)),
            _ => dots = None,
        }
        index += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(base: &str, target: &str) -> String {
        let upstream = Upstream::parse(base).unwrap();
        let sent = upstream.target(target.parse().unwrap());
        assert!(sent.scheme().is_none() && sent.authority().is_none());
        let url = upstream.url(&sent).to_string();
        assert_eq!(url, model_join(&upstream, target), "{base} {target}");
        url
    }

    /// The target as it was first built: a formatted string, parsed into an
    /// absolute URI.
    fn model_join(upstream: &Upstream, target: &str) -> String {
        let uri: Uri = target.parse().unwrap();
        let tail = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let slash = if tail.starts_with('/') { "" } else { "/" };
        let joined = format!("{}{slash}{tail}", upstream.prefix);
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(upstream.authority.clone())
            .path_and_query(joined)
            .build()
            .unwrap_or_else(|_| upstream.base())
            .to_string()
    }

    #[test]
    fn joins_prefix_and_request_target() {
        assert_eq!(
            join("http://127.0.0.1:9/prefix", "/mcp?x=1"),
            "http://127.0.0.1:9/prefix/mcp?x=1"
        );
        assert_eq!(
            join("http://127.0.0.1:9/prefix/", "/mcp"),
            "http://127.0.0.1:9/prefix/mcp"
        );
        assert_eq!(join("http://h:9", "/mcp"), "http://h:9/mcp");
        assert_eq!(join("http://h:9/", "/"), "http://h:9/");
        assert_eq!(join("http://h:9/mcp", "/"), "http://h:9/mcp/");
        assert_eq!(join("http://h", "/a?b=c&d"), "http://h/a?b=c&d");
        assert_eq!(join("http://h:9/p", "*"), "http://h:9/p/*");
        assert_eq!(join("http://h:9", "*"), "http://h:9/*");
        // Absolute-form targets (and HTTP/2 requests) carry an authority.
        assert_eq!(join("http://h:9", "http://a.example/x?y"), "http://h:9/x?y");
        assert_eq!(join("http://h:9", "http://a.example"), "http://h:9/");
        assert_eq!(join("http://h:9/p", "http://a.example/x"), "http://h:9/p/x");
        // An origin-form target under an empty prefix goes on as it is.
        let upstream = Upstream::parse("http://h:9").unwrap();
        let uri: Uri = "/mcp?x=1".parse().unwrap();
        assert_eq!(upstream.target(uri.clone()), uri);
    }

    proptest::proptest! {
        #[test]
        fn targets_match_the_model(
            base in "http://h:9(/[a-z]{0,3}){0,2}/?",
            target in "\\*|/[a-z/%.]{0,6}(\\?[a-z=&/?]{0,6})?|http://a\\.example(:8)?(/[a-z]{0,3})?(\\?[a-z]{0,3})?|a\\.example:8",
        ) {
            join(&base, &target);
        }
    }

    fn refusal(method: &str, target: &str, host: Option<&str>) -> Option<&'static str> {
        let mut request = http::Request::builder().method(method).uri(target);
        if let Some(host) = host {
            request = request.header(HOST, host);
        }
        refused(&request.body(()).unwrap().into_parts().0)
    }

    #[test]
    fn dot_segments_are_refused() {
        for bad in [
            "/..",
            "/../admin",
            "/mcp/../admin",
            "/./x",
            "/.",
            "/%2e%2e/admin",
            "/%2E%2e/x",
            "/.%2E/x",
            "/%2e/x",
            "/..%2fadmin",
            "/..%2Fadmin",
            "/..%5cadmin",
            "/a/..\\b",
            "/x/..?q=1",
        ] {
            assert!(refusal("GET", bad, None).is_some(), "{bad:?} passed");
        }
        for good in [
            "/",
            "/mcp",
            "/mcp?x=/../",
            "/file.json",
            "/...",
            "/.well-known/x",
            "/a..b",
            "/%2e%2e%2e",
            "/%41",
            "/%",
            "/%2",
            "/%zz",
            "*",
        ] {
            assert_eq!(refusal("GET", good, None), None, "{good:?} refused");
        }
    }

    #[test]
    fn connect_and_authority_form_are_refused() {
        assert!(refusal("CONNECT", "a.example:443", None).is_some());
        assert!(refusal("CONNECT", "/mcp", None).is_some());
        assert!(refusal("GET", "a.example:443", None).is_some());
        assert_eq!(refusal("OPTIONS", "*", None), None);
    }

    #[test]
    fn a_host_header_must_match_the_target_authority() {
        let absolute = "http://localhost:8080/mcp";
        assert_eq!(refusal("POST", absolute, None), None);
        assert_eq!(refusal("POST", absolute, Some("LOCALHOST:8080")), None);
        assert!(refusal("POST", absolute, Some("evil.example")).is_some());
        assert!(refusal("POST", absolute, Some("localhost")).is_some());
        assert_eq!(refusal("POST", "/mcp", Some("evil.example")), None);
    }

    #[test]
    fn host_is_the_upstream_authority() {
        let upstream = Upstream::parse("http://localhost:8000/mcp").unwrap();
        assert_eq!(upstream.host(), "localhost:8000");
        assert_eq!(upstream.as_str(), "http://localhost:8000/mcp");
        let upstream = Upstream::parse("http://[::1]:8000").unwrap();
        assert_eq!(upstream.host(), "[::1]:8000");
    }

    #[test]
    fn refuses_what_it_cannot_forward_to() {
        for bad in [
            "",
            "127.0.0.1:8000",
            "/mcp",
            "https://example.com/mcp",
            "ftp://h/",
            "http://user:pw@h/",
            "http://h/mcp?x=1",
            "not a url",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad:?} accepted");
        }
        let error = Upstream::parse("https://h").unwrap_err();
        assert!(error.to_string().contains("https"), "{error}");
    }
}
