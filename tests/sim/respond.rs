//! How the simulated server dresses its responses: the `Content-Encoding`
//! that is no coding and the byte order mark of some seeds, and the plain
//! responses it builds.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::upstream::UNKNOWN_SESSION;

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// How one response is dressed, in the seeds whose server does so.
#[derive(Clone, Copy, Default)]
pub struct Dress {
    /// A `Content-Encoding` that is no coding.
    pub coding: Option<&'static str>,
    /// A byte order mark leads the body.
    pub bom: bool,
}

/// `Content-Encoding` values that name no coding (RFC 9110 §8.4: a list,
/// `identity` is none, empty elements allowed).
pub const NO_CODINGS: [&str; 4] = ["identity", "identity, identity", "", "Identity ,"];

impl Dress {
    pub fn apply(self, mut response: Response<Body>) -> Response<Body> {
        if let Some(coding) = self.coding {
            response.headers_mut().insert(
                http::header::CONTENT_ENCODING,
                http::HeaderValue::from_static(coding),
            );
        }
        response
    }

    /// The mark, when the body has one.
    pub fn lead(self) -> Option<Bytes> {
        self.bom.then_some(Bytes::from_static(BOM))
    }
}

/// A UTF-8 byte order mark.
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

pub fn unknown_session() -> Response<Body> {
    let mut response = status(StatusCode::NOT_FOUND);
    response
        .headers_mut()
        .insert(UNKNOWN_SESSION, http::HeaderValue::from_static("1"));
    response
}

pub fn status(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed_unsync());
    *response.status_mut() = status;
    response
}

pub fn json_response(message: &Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(message.to_string())).boxed_unsync())
        .expect("a valid response")
}

pub fn json_body(answer: Bytes, dress: Dress) -> Response<Body> {
    let body = match dress.lead() {
        Some(bom) => Bytes::from([bom, answer].concat()),
        None => answer,
    };
    dress.apply(
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(body).boxed_unsync())
            .expect("a valid response"),
    )
}
