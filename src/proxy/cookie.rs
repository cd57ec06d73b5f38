//! `Cookie` fields of an HTTP/2 request, joined for the HTTP/1.1 hop.
//!
//! HTTP/2 clients may split the `Cookie` header into one field per cookie
//! (RFC 9113 §8.2.3: better header compression), and a request forwarded
//! over HTTP/1.1 must carry them joined with `"; "` into one field, as an
//! HTTP/1.1 client sends them (RFC 6265 §5.4). Sent as separate lines, most
//! servers read only the first (or join them with `", "`, which makes one
//! garbled cookie), and the session or auth cookie in a later field is lost.

use http::header::{HeaderValue, COOKIE};
use http::HeaderMap;

/// Joins the `Cookie` fields of `headers` into one, in order, with `"; "`;
/// one field or none is left as it is.
pub(super) fn join(headers: &mut HeaderMap) {
    let mut fields = headers.get_all(COOKIE).iter();
    let (Some(first), Some(_)) = (fields.next(), fields.next()) else {
        return;
    };
    let mut joined = Vec::with_capacity(first.len() * 4);
    let mut sensitive = false;
    for (index, field) in headers.get_all(COOKIE).iter().enumerate() {
        if index > 0 {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(field.as_bytes());
        sensitive |= field.is_sensitive();
    }
    // Valid field values joined by a valid separator make a valid value.
    let Ok(mut value) = HeaderValue::from_bytes(&joined) else {
        return;
    };
    // A field the client asked never to index (HPACK) keeps that wish.
    value.set_sensitive(sensitive);
    headers.insert(COOKIE, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(fields: &[&'static str]) -> Vec<String> {
        let mut headers = HeaderMap::new();
        headers.insert("x-other", HeaderValue::from_static("kept"));
        for field in fields {
            headers.append(COOKIE, HeaderValue::from_static(field));
        }
        join(&mut headers);
        assert_eq!(headers["x-other"], "kept");
        headers
            .get_all(COOKIE)
            .iter()
            .map(|value| value.to_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn split_cookie_fields_become_one() {
        assert_eq!(joined(&["a=1", "b=2", "c=3"]), ["a=1; b=2; c=3"]);
        assert_eq!(joined(&["a=1; b=2", "c=3"]), ["a=1; b=2; c=3"]);
        assert_eq!(joined(&["a=1"]), ["a=1"]);
        assert!(joined(&[]).is_empty());
    }
}
