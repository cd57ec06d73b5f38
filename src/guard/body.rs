//! Request and response bodies of [`IdGuard`](crate::IdGuard).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project::pin_project;

use crate::guard::reader::Reader;
use crate::guard::unanswered::Unanswered;
use crate::table::{Registration, Resumed, Table};
use crate::wire::protocol::{has_media_type, is_encoded};

/// The request body the inner service receives: the client's body untouched,
/// or, for a POST the guard had to read, the bytes it read (rewritten only
/// where an id was remapped) with the client's trailers.
#[pin_project]
#[derive(Debug)]
pub struct RequestBody<B> {
    #[pin]
    kind: RequestKind<B>,
}

#[pin_project(project = RequestKindProj)]
#[derive(Debug)]
enum RequestKind<B> {
    Original(#[pin] B),
    Buffered {
        data: Option<Bytes>,
        /// Boxed: rare, and every request body carries the variant's size
        /// (the inner service's future holds it, and tower stacks move it).
        trailers: Option<Box<HeaderMap>>,
    },
}

impl<B> RequestBody<B> {
    /// Wraps a body that passes through untouched.
    pub fn new(body: B) -> Self {
        Self {
            kind: RequestKind::Original(body),
        }
    }

    /// The bytes of a body the guard read (and maybe rewrote); `None` for
    /// one that passes untouched.
    pub(crate) fn into_buffered(self) -> Option<Bytes> {
        match self.kind {
            RequestKind::Buffered { data, .. } => Some(data.unwrap_or_default()),
            RequestKind::Original(_) => None,
        }
    }

    pub(crate) fn buffered(data: Bytes, trailers: Option<Box<HeaderMap>>) -> Self {
        Self {
            kind: RequestKind::Buffered {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            RequestKindProj::Original(body) => body
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map(into_bytes_frame))),
            RequestKindProj::Buffered { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(
                    trailers
                        .take()
                        .map(|trailers| Ok(Frame::trailers(*trailers))),
                )
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Original(body) => body.is_end_stream(),
            RequestKind::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Original(body) => body.size_hint(),
            RequestKind::Buffered { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |data| data.len() as u64))
            }
        }
    }
}

fn into_bytes_frame<D: Buf>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
}

/// The response body of [`IdGuard`](crate::IdGuard).
///
/// It carries the registration of the request's ids and releases it when
/// every response it waits for has passed, or when the body ends or is
/// dropped, whichever comes first. Responses the guard gives itself
/// (rejections, 413, 429) use the same type, so the inner body's error type
/// is kept.
#[pin_project]
#[derive(Debug)]
pub struct ResponseBody<B> {
    #[pin]
    kind: ResponseKind<B>,
}

#[pin_project(project = ResponseKindProj)]
#[derive(Debug)]
enum ResponseKind<B> {
    /// The inner body, unchanged. A registration held here learns of no
    /// response: its ids are abandoned when it is dropped.
    Inner {
        #[pin]
        body: B,
        registration: Option<Registration>,
    },
    /// A body that is read for responses as it streams, and restored when it
    /// may carry server-side ids.
    Read {
        #[pin]
        body: B,
        registration: Option<Registration>,
        reading: Reader,
        /// Boxed: rare, and every response carries the variant's size.
        trailers: Option<Box<HeaderMap>>,
        finished: bool,
    },
    /// A response the guard produced itself.
    Answer { body: Full<Bytes> },
}

/// How the guard reads a response body: for the responses it carries (which
/// free their ids) and, where it may hold ids the guard issued, to restore
/// the client's ids in them.
#[derive(Debug, Clone)]
pub(crate) struct Restoring {
    /// Counts what is restored; frees ids answered on a session's stream.
    pub(crate) table: Arc<Table>,
    /// The longest id a client could have sent (the body limit): a longer
    /// id token is not held back.
    pub(crate) max_id: usize,
    /// The request carried server-side ids (or the stream may replay
    /// answers to such requests): restore them.
    pub(crate) restore: bool,
    /// The session the response belongs to: only ids issued for it are
    /// restored.
    pub(crate) session: Option<HeaderValue>,
    /// A `GET` resuming the stream with this tag (its `Last-Event-ID`): an
    /// answer on it is that stream's request's, and frees its id if the
    /// request was abandoned when its own stream ended early.
    pub(crate) resumes: Option<Resumed>,
}

/// An empty inner body; lets tower-http's `TimeoutLayer` (which builds its
/// `408` from `Default`) wrap the guard directly.
impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        Self {
            kind: ResponseKind::Inner {
                body: B::default(),
                registration: None,
            },
        }
    }
}

impl<B: Body> ResponseBody<B> {
    pub(crate) fn inner(body: B, registration: Option<Registration>) -> Self {
        Self {
            kind: ResponseKind::Inner { body, registration },
        }
    }

    pub(crate) fn answer(body: Full<Bytes>) -> Self {
        Self {
            kind: ResponseKind::Answer { body },
        }
    }

    /// Moves the registration into the response body, choosing how the body
    /// is read: for the responses the registration waits for, for a
    /// session's answers on a stream of its own, and to restore client ids
    /// where the request carried server-side ones.
    pub(crate) fn wrap(
        response: Response<B>,
        mut registration: Option<Registration>,
        restoring: Option<Restoring>,
    ) -> Response<Self> {
        if registration.is_none() && restoring.is_none() {
            // Nothing awaited, nothing to restore: the body passes as it is.
            return response.map(|body| Self::inner(body, None));
        }
        let (mut parts, body) = response.into_parts();
        let Some(reading) = read_response(&mut parts, &mut registration, restoring) else {
            return Response::from_parts(parts, Self::inner(body, registration));
        };
        let kind = ResponseKind::Read {
            body,
            registration,
            reading,
            trailers: None,
            finished: false,
        };
        Response::from_parts(parts, Self { kind })
    }
}

/// How a response is read, decided on its head: the step after the inner
/// service answered, in every face. `None`: the body passes as it is (what
/// the registration holds is abandoned when it ends). Restoring removes the
/// response's `Content-Length`.
pub(crate) fn read_response(
    parts: &mut http::response::Parts,
    registration: &mut Option<Registration>,
    restoring: Option<Restoring>,
) -> Option<Reader> {
    // An answer given in the server's place is no response from it. Only
    // a forwarder that knows says so (`Unanswered`). A status alone says
    // nothing: a `408` from a timeout inside the guard, a `413` from a
    // body limit there, or a `5xx` may come after the server started the
    // request, which it then keeps running under its id. Such a response
    // is read like any other: the server's own JSON-RPC answer (a
    // refusal carrying the id) frees the id, anything else leaves it
    // abandoned.
    //
    // A `502`, `503` or `504` is a gateway's (RFC 9110 §15.6): a proxy
    // in front of the server answering for it, however its body reads.
    // Its JSON-RPC error may carry the request's id (the `mcp-id-guard`
    // proxy's own do), but an `Unanswered` mark does not cross HTTP.
    let gateway = matches!(
        parts.status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    );
    let stand_in = parts
        .extensions
        .get::<Unanswered>()
        .copied()
        .or(gateway.then_some(Unanswered::Sent));
    if stand_in == Some(Unanswered::NotSent) {
        if let Some(registration) = registration.take() {
            registration.unsent();
        }
    }
    let awaits = stand_in.is_none() && registration.as_ref().is_some_and(Registration::awaits_any);
    let restores = restoring
        .as_ref()
        .is_some_and(|restoring| restoring.restore);
    let resumes = restoring
        .as_ref()
        .and_then(|restoring| restoring.resumes)
        .filter(|_| stand_in.is_none());
    let watch = awaits || resumes.is_some();
    // A compressed body cannot be read: nothing in it counts as answered.
    // `identity` is no compression (as on requests).
    let readable = (watch || restores) && !is_encoded(&parts.headers);
    let json = has_media_type(&parts.headers, "application/json");
    let (Some(restoring), true, true) = (
        restoring,
        readable,
        json || has_media_type(&parts.headers, "text/event-stream"),
    ) else {
        return None;
    };
    // Only restoring changes the bytes; a body only watched keeps its
    // length.
    if restores {
        parts.headers.remove(CONTENT_LENGTH);
    }
    // A tracked request always has a session; an empty one matches no id
    // issued for a real session.
    let session = restoring
        .session
        .as_ref()
        .map_or(&[][..], HeaderValue::as_bytes);
    Some(Reader {
        session: restoring.table.minter().session_digest(session),
        resumes: restoring.session.zip(resumes),
        event_ids: 0,
        table: restoring.table,
        max_id: restoring.max_id,
        restores,
        watch,
        json,
        requests: registration.as_ref().map_or(0, Registration::requests),
        streaming: None,
    })
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            ResponseKindProj::Inner {
                mut body,
                registration,
            } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                // The exchange is over, and no response was seen in it (hyper
                // stops polling once `is_end_stream` says so, and says so
                // after an error too): what the registration holds is
                // abandoned now rather than when the body is dropped.
                if frame.is_none() || body.is_end_stream() {
                    registration.take();
                }
                Poll::Ready(frame.map(|frame| frame.map(into_bytes_frame)))
            }
            ResponseKindProj::Read {
                mut body,
                registration,
                reading,
                trailers,
                finished,
            } => loop {
                if *finished {
                    return Poll::Ready(
                        trailers
                            .take()
                            .map(|trailers| Ok(Frame::trailers(*trailers))),
                    );
                }
                match ready!(body.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(mut data) => {
                            let next =
                                reading.chunk(data.copy_to_bytes(data.remaining()), registration);
                            if let Some(piece) = next {
                                return Poll::Ready(Some(Ok(Frame::data(piece))));
                            }
                        }
                        // Trailers come last; held until the held-back bytes are out.
                        Err(frame) => *trailers = frame.into_trailers().ok().map(Box::new),
                    },
                    // The registration stays: dropped with the body, it
                    // leaves what was not answered abandoned.
                    Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                    None => {
                        *finished = true;
                        if let Some(piece) = reading.end(registration) {
                            return Poll::Ready(Some(Ok(Frame::data(piece))));
                        }
                    }
                }
            },
            ResponseKindProj::Answer { body } => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map_err(|never| match never {}))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Inner { body, .. } => body.is_end_stream(),
            ResponseKind::Read {
                finished, trailers, ..
            } => *finished && trailers.is_none(),
            ResponseKind::Answer { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Inner { body, .. } => body.size_hint(),
            // A body only watched goes on byte for byte, what the guard
            // holds back of it included; a restored one's length is known
            // only once rewritten.
            ResponseKind::Read { body, reading, .. } if !reading.restores => {
                let held = reading.held();
                let inner = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower().saturating_add(held));
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper.saturating_add(held));
                }
                hint
            }
            ResponseKind::Read { .. } => SizeHint::default(),
            ResponseKind::Answer { body } => body.size_hint(),
        }
    }
}

/// A tracked request's body read so far.
/// A body that arrives in one chunk (the usual case) is kept as that chunk,
/// without copying.
#[derive(Debug, Default)]
pub(crate) struct Accumulated {
    single: Bytes,
    joined: BytesMut,
}

impl Accumulated {
    pub(crate) fn len(&self) -> usize {
        self.single.len() + self.joined.len()
    }

    /// The bytes it holds in memory: a joined body's buffer may be larger
    /// than its length (what a budget charges).
    pub(crate) fn held(&self) -> usize {
        self.single.len() + self.joined.capacity()
    }

    pub(crate) fn push(&mut self, chunk: Bytes) {
        if self.len() == 0 {
            self.single = chunk;
            return;
        }
        if !self.single.is_empty() {
            self.joined
                .extend_from_slice(&std::mem::take(&mut self.single));
        }
        self.joined.extend_from_slice(&chunk);
    }

    pub(crate) fn into_bytes(self) -> Bytes {
        if self.joined.is_empty() {
            self.single
        } else {
            self.joined.freeze()
        }
    }
}
