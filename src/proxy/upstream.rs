//! The upstream base URL: parsed once, joined with each request's path.

use std::fmt;

use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::HeaderValue;

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
        Ok(Self {
            authority,
            host,
            prefix,
            display,
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
        // `OPTIONS *` and other forms without a leading slash get one.
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
