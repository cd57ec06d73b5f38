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

    /// The URI to send a request for `path_and_query` to: the prefix, then the
    /// request's path and query as the client sent them.
    pub(crate) fn join(&self, path_and_query: Option<&PathAndQuery>) -> Uri {
        let tail = path_and_query.map_or("/", PathAndQuery::as_str);
        // `OPTIONS *` and other forms without a leading slash get one.
        let slash = if tail.starts_with('/') { "" } else { "/" };
        let joined = format!("{}{slash}{tail}", self.prefix);
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(joined)
            .build()
            // The prefix came from a valid URI and the tail from a valid
            // request target; their concatenation is a valid path.
            .unwrap_or_else(|_| self.base())
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
        let target: PathAndQuery = target.parse().unwrap();
        upstream.join(Some(&target)).to_string()
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
        let upstream = Upstream::parse("http://h:9/p").unwrap();
        assert_eq!(upstream.join(None).to_string(), "http://h:9/p/");
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
