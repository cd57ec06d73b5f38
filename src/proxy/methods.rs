//! Requests the proxy answers itself because of their method, without
//! contacting the upstream: `TRACE` and `CONNECT` (`405`), and `OPTIONS *`
//! (`200`).
//!
//! `TRACE` would have the upstream echo the request it received, headers
//! the proxy added included (`X-Forwarded-For`, and with
//! [`preserve_host`](super::ProxyBuilder::preserve_host) off the upstream's
//! own `Host`), and is the old cross-site tracing vector; nginx answers it
//! `405` itself. `CONNECT` asks for a tunnel, which the proxy is not.
//!
//! `OPTIONS *` (asterisk form) asks about the server in general, not one
//! of its resources (RFC 9110 §9.3.7). To the client the server is the
//! proxy, and the upstream's base URL may carry a path prefix, under which
//! an asterisk-form target means nothing; so the proxy answers it, as a
//! reverse proxy may, with `200` and the methods it forwards in `Allow`
//! (before, it reached the upstream as `OPTIONS /*`, a request for a
//! resource named `*`). `OPTIONS` for a path (CORS preflights) is forwarded
//! as before.

use http::header::{HeaderValue, ALLOW, CONTENT_LENGTH};
use http::request::Parts;
use http::{Method, Response, StatusCode};
use http_body_util::Full;

use super::body::ProxyBody;
use super::failure::{local, ErrorIds};
use crate::guard::Unanswered;
use crate::wire::answer;

/// The methods the proxy forwards (the standard ones but `TRACE` and
/// `CONNECT`; others pass too): what its `405` and its `OPTIONS *` answer
/// name in `Allow`. The upstream may still refuse some for a resource.
pub(crate) const ALLOWED: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// The proxy's own answer to a request it does not forward because of its
/// method, or `None` when the request goes on. Marked
/// [`Unanswered::NotSent`], as every answer the proxy gives in the
/// upstream's place before sending is.
pub(super) fn answered_here(parts: &Parts) -> Option<Response<ProxyBody>> {
    let mut response = if parts.method == Method::TRACE || parts.method == Method::CONNECT {
        tracing::debug!(method = %parts.method, "method not forwarded: 405");
        let message = if parts.method == Method::TRACE {
            "Method Not Allowed: TRACE is not served"
        } else {
            "Method Not Allowed: CONNECT is not served (this is no tunnel)"
        };
        local(
            StatusCode::METHOD_NOT_ALLOWED,
            &ErrorIds::Null,
            answer::INVALID_REQUEST,
            message,
        )
    } else if parts.method == Method::OPTIONS && parts.uri == "*" {
        let mut response = Response::new(ProxyBody::local(Full::default()));
        response
            .headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        response
    } else {
        return None;
    };
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(ALLOWED));
    response.extensions_mut().insert(Unanswered::NotSent);
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(method: &str, target: &str) -> Option<StatusCode> {
        let request = http::Request::builder()
            .method(method)
            .uri(target)
            .body(())
            .unwrap();
        answered_here(&request.into_parts().0).map(|response| {
            assert_eq!(response.headers()[ALLOW], ALLOWED);
            assert_eq!(
                response.extensions().get::<Unanswered>(),
                Some(&Unanswered::NotSent)
            );
            response.status()
        })
    }

    #[test]
    fn trace_connect_and_options_star_are_answered_here() {
        let not_allowed = Some(StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(answer("TRACE", "/mcp"), not_allowed);
        assert_eq!(answer("CONNECT", "a.example:443"), not_allowed);
        assert_eq!(answer("OPTIONS", "*"), Some(StatusCode::OK));
        for (method, target) in [
            ("OPTIONS", "/mcp"),
            ("GET", "/mcp"),
            ("GET", "*"),
            ("POST", "/mcp"),
            ("DELETE", "/mcp"),
            ("PROPFIND", "/mcp"),
        ] {
            assert_eq!(answer(method, target), None, "{method} {target}");
        }
    }
}
