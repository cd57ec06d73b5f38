//! Request and response bodies of [`IdGuard`](crate::IdGuard).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project::pin_project;

use crate::protocol::has_media_type;
use crate::restore::{Part, Restorer};
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
    /// A body that may carry server-side ids, restored as it streams.
    Restore {
        #[pin]
        body: B,
        registration: Option<Registration>,
        table: Arc<Table>,
        /// Boxed: the unchanged inner body, the common case, stays small.
        stream: Box<Stream>,
        /// Restored pieces ready to go on.
        out: VecDeque<Bytes>,
        trailers: Option<HeaderMap>,
        finished: bool,
    },
    /// A response the guard produced itself.
    Answer { body: Full<Bytes> },
}

/// What the guard needs to restore client ids in a response.
#[derive(Debug, Clone)]
pub(crate) struct Restoring {
    /// Counts what is restored.
    pub(crate) table: Arc<Table>,
    /// The longest id a client could have sent (the body limit): a longer
    /// id token is not held back.
    pub(crate) max_id: usize,
}

/// How a restored body is framed.
#[derive(Debug)]
enum Stream {
    /// One JSON text (`application/json`). The last restored piece is held
    /// until the body ends, so the registration is released before the client
    /// has the whole response and an immediate reuse of the id never collides.
    Json {
        restorer: Restorer,
        offset: usize,
        last: Option<Bytes>,
    },
    /// A `text/event-stream`.
    Sse(SseRewriter),
}

impl Stream {
    fn push(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) {
        match self {
            Stream::Json {
                restorer,
                offset,
                last,
            } => {
                let start = *offset;
                *offset += chunk.len();
                let mut pieces = VecDeque::new();
                restorer.push(&chunk, start, &[Part::Json(start..*offset)], &mut pieces);
                for piece in pieces {
                    out.extend(last.replace(piece));
                }
            }
            Stream::Sse(rewriter) => rewriter.push(chunk, out),
        }
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        match self {
            Stream::Json {
                restorer,
                offset,
                last,
            } => {
                out.extend(last.take());
                restorer.push(&Bytes::new(), *offset, &[Part::End(*offset)], out);
                restorer.finish(out);
            }
            Stream::Sse(rewriter) => rewriter.finish(out),
        }
    }

    fn take_restored(&mut self) -> usize {
        match self {
            Stream::Json { restorer, .. } => restorer.take_restored(),
            Stream::Sse(rewriter) => rewriter.take_restored(),
        }
    }

    /// Every response the exchange waits for has passed.
    fn all_answered(&self) -> bool {
        match self {
            Stream::Json { .. } => false,
            Stream::Sse(rewriter) => rewriter.all_answered(),
        }
    }
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

    fn restore(
        body: B,
        registration: Option<Registration>,
        table: Arc<Table>,
        stream: Stream,
    ) -> Self {
        Self {
            kind: ResponseKind::Restore {
                body,
                registration,
                table,
                stream: Box::new(stream),
                out: VecDeque::new(),
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
        restoring: Option<Restoring>,
    ) -> Response<Self> {
        let (mut parts, body) = response.into_parts();
        // Under Reject and Queue an event stream is also watched for the
        // responses, so the ids are free as soon as the client has them, even if
        // the server keeps the stream open a little longer.
        let awaited = registration
            .as_ref()
            .map(Registration::awaited_keys)
            .unwrap_or_default();
        // The media type is read only when the body may be rewritten: most
        // answers (unique ids under Remap) pass as they are.
        let is_sse = || has_media_type(&parts.headers, "text/event-stream");
        let restoring = restoring.or_else(|| {
            // Watching needs the rewriter even when nothing is restored.
            let table = registration.as_ref()?.table();
            (!awaited.is_empty() && is_sse()).then(|| Restoring {
                table: Arc::clone(table),
                max_id: usize::MAX,
            })
        });
        let Some(Restoring { table, max_id }) = restoring else {
            return Response::from_parts(parts, Self::inner(body, registration));
        };
        let is_sse = is_sse();
        let stream = if has_media_type(&parts.headers, "application/json") {
            Stream::Json {
                restorer: Restorer::new(max_id, false),
                offset: 0,
                last: None,
            }
        } else if is_sse {
            Stream::Sse(SseRewriter::watching(max_id, awaited))
        } else {
            return Response::from_parts(parts, Self::inner(body, registration));
        };
        parts.headers.remove(CONTENT_LENGTH);
        Response::from_parts(parts, Self::restore(body, registration, table, stream))
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
            ResponseKindProj::Restore {
                mut body,
                registration,
                table,
                stream,
                out,
                trailers,
                finished,
            } => loop {
                if let Some(piece) = out.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(piece))));
                }
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
                            stream.push(data.copy_to_bytes(data.remaining()), out);
                            note_restored(table, stream.take_restored());
                            // Released before the answer's last bytes go on.
                            if stream.all_answered() {
                                complete(registration);
                            }
                        }
                        // Trailers come last; held until the held-back bytes are out.
                        Err(frame) => *trailers = frame.into_trailers().ok(),
                    },
                    Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                    None => {
                        *finished = true;
                        stream.finish(out);
                        note_restored(table, stream.take_restored());
                        complete(registration);
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
            ResponseKind::Restore {
                finished,
                out,
                trailers,
                ..
            } => *finished && out.is_empty() && trailers.is_none(),
            ResponseKind::Answer { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Inner { body, .. } => body.size_hint(),
            // The restored length is known only once rewritten.
            ResponseKind::Restore { .. } => SizeHint::default(),
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
