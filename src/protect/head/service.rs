use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;

use crate::protect::refused::Refused;
use crate::wire::answer;

/// Answers requests whose head is over its limit with `431`, and passes the
/// others to the inner service. Made by [`HeadLimitLayer`](super::HeadLimitLayer);
/// see the [module docs](super).
#[derive(Debug, Clone, Copy)]
pub struct HeadLimit<S> {
    inner: S,
    max_bytes: usize,
}

impl<S> HeadLimit<S> {
    pub(super) fn new(inner: S, max_bytes: usize) -> Self {
        Self { inner, max_bytes }
    }

    /// The limit, in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    inner_accessors!();
}

impl<S> HeadLimit<S> {
    /// `431` for a head over the limit.
    fn refusal<B>(&self, request: &Request<B>) -> Option<(Refused, Response<Full<Bytes>>)> {
        (head_size(request) > self.max_bytes)
            .then(|| (Refused::HeadSize, answer::head_too_large(self.max_bytes)))
    }
}

head_check_service!(HeadLimit);

/// The size of a request head as HTTP/1.1 sends it: request line, and each
/// header as `name: value` and a line break. The same measure for HTTP/2
/// requests (whose HPACK-compressed size the server does not expose), so
/// one limit means one thing on both.
pub(super) fn head_size<B>(request: &Request<B>) -> usize {
    let uri = request.uri();
    let target = uri
        .path_and_query()
        .map_or(1, |target| target.as_str().len())
        + uri
            .authority()
            .map_or(0, |authority| authority.as_str().len());
    // "METHOD target HTTP/1.1\r\n": two spaces, ten bytes of version and
    // line break.
    let line = request.method().as_str().len() + target + 12;
    request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_size_counts_what_http1_sends() {
        let request = Request::post("/mcp?x=1")
            .header("host", "localhost:8080")
            .header("x-a", "b")
            .body(())
            .unwrap();
        let sent = "POST /mcp?x=1 HTTP/1.1\r\nhost: localhost:8080\r\nx-a: b\r\n";
        assert_eq!(head_size(&request), sent.len());
    }
}
