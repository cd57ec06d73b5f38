//! For the service inside the guard: the request it receives
//! ([`InnerRequest`]), the server-side ids of remapped requests
//! ([`ServerSideId`]), and the mark a forwarding service puts on an answer it
//! gives in the server's place ([`Unanswered`]). For testing an inner service
//! of your own, writing a forwarding service, or a server that logs the ids
//! it runs.
//!
//! # Testing with `tower-test`
//! [`IdGuard`](crate::IdGuard) reads a tracked POST's body **in its response
//! future**, before it decides which id the server sees, so the inner service
//! is called only once that future is polled: a `tower-test` mock sees no
//! request while the future sits unpolled, and a test that waits for the mock's
//! request before polling (or spawning) the future waits forever.
//!
//! ```
//! use bytes::Bytes;
//! use futures::FutureExt as _;
//! use http_body_util::{BodyExt as _, Full};
//! use mcp_id_guard::inner::InnerRequest;
//! use mcp_id_guard::IdGuardLayer;
//! use tower::{Layer as _, Service as _, ServiceExt as _};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (mock, mut handle) =
//!     tower_test::mock::pair::<InnerRequest<Full<Bytes>>, http::Response<Full<Bytes>>>();
//! let mut guard = IdGuardLayer::new().layer(mock);
//!
//! let request = http::Request::post("/mcp")
//!     .header("mcp-session-id", "session-1")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)))
//!     .unwrap();
//! let response = guard.ready().await.unwrap().call(request);
//! // Not polled yet: the guard has not read the body, the mock has no request.
//! assert!(handle.next_request().now_or_never().is_none());
//!
//! // Polled (here on a task of its own), the future reads the body and
//! // calls the mock.
//! let response = tokio::spawn(response);
//! let (request, answer) = handle.next_request().await.unwrap();
//! let body = request.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(body, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
//! answer.send_response(
//!     http::Response::builder()
//!         .header("content-type", "application/json")
//!         .body(Full::new(Bytes::from(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#)))
//!         .unwrap(),
//! );
//! let response = response.await.unwrap().unwrap();
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(body, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
//! # }
//! ```

use crate::guard::RequestBody;
use crate::wire::id;

pub use crate::guard::unanswered::Unanswered;

/// The request the service inside [`IdGuard`](crate::IdGuard) receives when
/// the client's request body is `B`: the client's request, its body wrapped
/// in [`GuardRequestBody`](crate::guard::GuardRequestBody) (the bytes the guard read, rewritten only where an id
/// was remapped, or the client's body untouched).
///
/// The type to name in a `tower-test` mock, or in the bounds of a service
/// written to sit inside the guard:
///
/// ```
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use mcp_id_guard::inner::InnerRequest;
/// use mcp_id_guard::IdGuardLayer;
/// use tower::Layer as _;
///
/// async fn answer(_request: InnerRequest<Full<Bytes>>) -> Result<http::Response<Full<Bytes>>, Infallible> {
///     Ok(http::Response::new(Full::default()))
/// }
///
/// let guarded = IdGuardLayer::new().layer(tower::service_fn(answer));
/// # let _ = guarded;
/// ```
pub type InnerRequest<B> = http::Request<RequestBody<B>>;

/// A server-side id, as the guard sends a remapped request to the server:
/// the JSON string `"mcp-id-guard:<mac>:<counter>:<original id JSON>"`.
///
/// [`parse`](Self::parse) recognises the form and takes the client's
/// original id out of it; it does not check the MAC, which takes the
/// guard's secret and the session (responses are restored only when it
/// matches). Use it to tell, in a test or a log, that a request reached the
/// server remapped, and for which client id.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt as _, Full};
/// use mcp_id_guard::inner::{InnerRequest, ServerSideId};
/// use mcp_id_guard::IdGuardLayer;
/// use tower::{Layer as _, Service as _, ServiceExt as _};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (mock, mut handle) =
///     tower_test::mock::pair::<InnerRequest<Full<Bytes>>, http::Response<Full<Bytes>>>();
/// let mut guard = IdGuardLayer::new().layer(mock);
/// let call = || {
///     http::Request::post("/mcp")
///         .header("mcp-session-id", "session-1")
///         .body(Full::new(Bytes::from(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#)))
///         .unwrap()
/// };
/// // Two calls with `id: 1` in one session, both in flight.
/// let first = tokio::spawn(guard.ready().await.unwrap().call(call()));
/// let (first_request, _first_answer) = handle.next_request().await.unwrap();
/// let second = tokio::spawn(guard.ready().await.unwrap().call(call()));
/// let (second_request, _second_answer) = handle.next_request().await.unwrap();
///
/// let id_of = |body: Bytes| {
///     let message: serde_json::Map<String, serde_json::Value> =
///         serde_json::from_slice(&body).unwrap();
///     message["id"].to_string() // the id's JSON text
/// };
/// let first_id = id_of(first_request.into_body().collect().await.unwrap().to_bytes());
/// let second_id = id_of(second_request.into_body().collect().await.unwrap().to_bytes());
///
/// assert_eq!(first_id, "1");
/// assert!(ServerSideId::parse(&first_id).is_none());
/// let remapped = ServerSideId::parse(&second_id).expect("the duplicate was remapped");
/// assert_eq!(remapped.original(), "1");
/// # drop((first, second));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSideId {
    original: String,
    counter: u64,
}

impl ServerSideId {
    /// What every server-side id's text starts with. A client id that
    /// starts with it is itself remapped, so restoring unwraps one level.
    pub const PREFIX: &'static str = id::RESERVED_PREFIX;

    /// Reads `id_json`, an id's exact JSON text (`"\"mcp-id-guard:…\""`, with
    /// its quotes), as a server-side id: `None` for any id the guard did not
    /// write this way (a client's own id, a number, a malformed look-alike).
    ///
    /// ```
    /// use mcp_id_guard::inner::ServerSideId;
    ///
    /// let id = ServerSideId::parse(r#""mcp-id-guard:0123456789abcdef:42:\"a\"""#).unwrap();
    /// assert_eq!(id.original(), r#""a""#);
    /// assert_eq!(id.counter(), 42);
    /// assert!(ServerSideId::parse("1").is_none());
    /// assert!(ServerSideId::parse(r#""mcp-id-guard:not-a-mac:1:1""#).is_none());
    /// ```
    pub fn parse(id_json: &str) -> Option<Self> {
        let parts = id::parse(id_json)?;
        Some(Self {
            counter: parts.serial.parse().ok()?,
            original: parts.original.into_owned(),
        })
    }

    /// The client's original id, as the JSON text it sent (`1`, `"a"`):
    /// what the guard puts back in the response.
    pub fn original(&self) -> &str {
        &self.original
    }

    /// The guard's counter: unique among the ids one guard instance issues.
    pub fn counter(&self) -> u64 {
        self.counter
    }
}
