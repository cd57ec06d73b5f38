//! Request and response bodies of [`IdGuard`](crate::IdGuard).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project::pin_project;

use crate::edit::splice;
use crate::id::IdKey;
use crate::protocol::has_media_type;
use crate::restore::restore_edits;
use crate::sse::SseRewriter;
use crate::table::{Registration, Table};

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
        trailers: Option<HeaderMap>,
    },
}

impl<B> RequestBody<B> {
    /// Wraps a body that passes through untouched.
    pub fn new(body: B) -> Self {
        Self {
            kind: RequestKind::Original(body),
        }
    }

    pub(crate) fn buffered(data: Bytes, trailers: Option<HeaderMap>) -> Self {
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
                        .map(|trailers| Ok(Frame::trailers(trailers))),
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

/// Ends a registration whose exchange ended normally: the server has answered.
/// Dropping it any other way marks its ids abandoned.
fn complete(registration: &mut Option<Registration>) {
    if let Some(registration) = registration.take() {
        registration.complete();
    }
}

fn note_restored(table: &Table, count: usize) {
    if count > 0 {
        table.note_restored(count);
        tracing::debug!(count, "restored client ids in a response");
    }
}

fn into_bytes_frame<D: Buf>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
}

/// The response body of [`IdGuard`](crate::IdGuard).
///
/// It carries the registration of the request's ids and releases it when the
/// body ends or is dropped, whichever comes first. Responses the guard gives
/// itself (rejections, 413, 429) use the same type, so the inner body's error
/// type is kept.
#[pin_project]
#[derive(Debug)]
pub struct ResponseBody<B> {
    #[pin]
    kind: ResponseKind<B>,
}

#[pin_project(project = ResponseKindProj)]
#[derive(Debug)]
enum ResponseKind<B> {
    /// The inner body, unchanged.
    Inner {
        #[pin]
        body: B,
        registration: Option<Registration>,
    },
    /// An `application/json` body that carries a server-side id: read whole,
    /// then emitted with the client's id restored.
    RestoreJson {
        #[pin]
        body: B,
        registration: Option<Registration>,
        table: Arc<Table>,
        buffer: Accumulated,
        trailers: Option<HeaderMap>,
        restored: Option<Bytes>,
        finished: bool,
    },
    /// A `text/event-stream` body, rewritten event by event.
    RestoreSse {
        #[pin]
        body: B,
        registration: Option<Registration>,
        table: Arc<Table>,
        rewriter: SseRewriter,
        trailers: Option<HeaderMap>,
        finished: bool,
    },
    /// A response the guard produced itself.
    Answer { body: Full<Bytes> },
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
    pub(crate) fn inner(body: B, mut registration: Option<Registration>) -> Self {
        // A body that is empty from the start is never polled.
        if body.is_end_stream() {
            complete(&mut registration);
        }
        Self {
            kind: ResponseKind::Inner { body, registration },
        }
    }

    pub(crate) fn restore_json(
        body: B,
        registration: Option<Registration>,
        table: Arc<Table>,
    ) -> Self {
        Self {
            kind: ResponseKind::RestoreJson {
                body,
                registration,
                table,
                buffer: Accumulated::default(),
                trailers: None,
                restored: None,
                finished: false,
            },
        }
    }

    pub(crate) fn restore_sse(
        body: B,
        registration: Option<Registration>,
        table: Arc<Table>,
        awaited: Vec<IdKey>,
    ) -> Self {
        Self {
            kind: ResponseKind::RestoreSse {
                body,
                registration,
                table,
                rewriter: SseRewriter::awaiting(awaited),
                trailers: None,
                finished: false,
            },
        }
    }

    pub(crate) fn answer(body: Full<Bytes>) -> Self {
        Self {
            kind: ResponseKind::Answer { body },
        }
    }

    /// Moves the registration into the response body, choosing how the body is
    /// rewritten when the request carried a server-side id.
    pub(crate) fn wrap(
        response: Response<B>,
        registration: Option<Registration>,
        restore: Option<Arc<Table>>,
    ) -> Response<Self> {
        let (mut parts, body) = response.into_parts();
        // Under Reject and Queue an event stream is also watched for the
        // responses, so the ids are free as soon as the client has them, even if
        // the server keeps the stream open a little longer.
        let awaited = registration
            .as_ref()
            .map(Registration::awaited_keys)
            .unwrap_or_default();
        let is_json = has_media_type(&parts.headers, "application/json");
        let is_sse = has_media_type(&parts.headers, "text/event-stream");
        let body = match restore {
            Some(table) if is_json => {
                parts.headers.remove(CONTENT_LENGTH);
                Self::restore_json(body, registration, table)
            }
            Some(table) if is_sse => {
                parts.headers.remove(CONTENT_LENGTH);
                Self::restore_sse(body, registration, table, awaited)
            }
            None if is_sse && !awaited.is_empty() => {
                let table = registration
                    .as_ref()
                    .map(|registration| Arc::clone(registration.table()));
                match table {
                    Some(table) => Self::restore_sse(body, registration, table, awaited),
                    None => Self::inner(body, registration),
                }
            }
            _ => Self::inner(body, registration),
        };
        Response::from_parts(parts, body)
    }
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
                // hyper stops polling once `is_end_stream` says so, so the end
                // is noticed here as well as on `None`.
                if frame.is_none() || body.is_end_stream() {
                    complete(registration);
                }
                Poll::Ready(frame.map(|frame| frame.map(into_bytes_frame)))
            }
            ResponseKindProj::RestoreJson {
                mut body,
                registration,
                table,
                buffer,
                trailers,
                restored,
                finished,
            } => {
                while !*finished {
                    match ready!(body.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => match frame.into_data() {
                            Ok(mut data) => buffer.push(data.copy_to_bytes(data.remaining())),
                            Err(frame) => *trailers = frame.into_trailers().ok(),
                        },
                        Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                        None => {
                            *finished = true;
                            let whole = std::mem::take(buffer).into_bytes();
                            let edits = restore_edits(&whole);
                            note_restored(table, edits.len());
                            *restored = Some(if edits.is_empty() {
                                whole
                            } else {
                                Bytes::from(splice(&whole, &edits))
                            });
                            // Released before the client can see the response,
                            // so an immediate reuse of the id never collides.
                            complete(registration);
                        }
                    }
                }
                if let Some(data) = restored.take().filter(|data| !data.is_empty()) {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(
                    trailers
                        .take()
                        .map(|trailers| Ok(Frame::trailers(trailers))),
                )
            }
            ResponseKindProj::RestoreSse {
                mut body,
                registration,
                table,
                rewriter,
                trailers,
                finished,
            } => loop {
                if *finished {
                    return Poll::Ready(
                        trailers
                            .take()
                            .map(|trailers| Ok(Frame::trailers(trailers))),
                    );
                }
                match ready!(body.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(mut data) => {
                            let out = rewriter.push(data.copy_to_bytes(data.remaining()));
                            note_restored(table, rewriter.take_restored());
                            if rewriter.all_answered() {
                                complete(registration);
                            }
                            if let Some(out) = out {
                                return Poll::Ready(Some(Ok(Frame::data(out))));
                            }
                        }
                        // Trailers come last; held until the held-back bytes are out.
                        Err(frame) => *trailers = frame.into_trailers().ok(),
                    },
                    Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                    None => {
                        *finished = true;
                        complete(registration);
                        let rest = rewriter.finish();
                        note_restored(table, rewriter.take_restored());
                        if let Some(rest) = rest {
                            return Poll::Ready(Some(Ok(Frame::data(rest))));
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
            ResponseKind::RestoreJson {
                finished,
                restored,
                trailers,
                ..
            } => *finished && restored.is_none() && trailers.is_none(),
            ResponseKind::RestoreSse {
                finished, trailers, ..
            } => *finished && trailers.is_none(),
            ResponseKind::Answer { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Inner { body, .. } => body.size_hint(),
            // The restored length is known only once rewritten.
            ResponseKind::RestoreJson { .. } | ResponseKind::RestoreSse { .. } => {
                SizeHint::default()
            }
            ResponseKind::Answer { body } => body.size_hint(),
        }
    }
}

/// A body read so far (a tracked request's, or a JSON response to restore).
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
