//! Request and response bodies of [`IdGuard`](crate::IdGuard).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project::pin_project;

use crate::envelope::splice;
use crate::id::IdKey;
use crate::rewrite::restore_edits;
use crate::sse::SseRewriter;
use crate::table::{InFlight, Table};

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
fn complete(in_flight: &mut Option<InFlight>) {
    if let Some(in_flight) = in_flight.take() {
        in_flight.complete();
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
        in_flight: Option<InFlight>,
    },
    /// An `application/json` body that carries a server-side id: read whole,
    /// then emitted with the client's id restored.
    RestoreJson {
        #[pin]
        body: B,
        in_flight: Option<InFlight>,
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
        in_flight: Option<InFlight>,
        table: Arc<Table>,
        rewriter: SseRewriter,
        trailers: Option<HeaderMap>,
        finished: bool,
    },
    /// A response the guard produced itself.
    Guard { body: Full<Bytes> },
}

/// An empty inner body; lets tower-http's `TimeoutLayer` (which builds its
/// `408` from `Default`) wrap the guard directly.
impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        Self {
            kind: ResponseKind::Inner {
                body: B::default(),
                in_flight: None,
            },
        }
    }
}

impl<B: Body> ResponseBody<B> {
    pub(crate) fn inner(body: B, mut in_flight: Option<InFlight>) -> Self {
        // A body that is empty from the start is never polled.
        if body.is_end_stream() {
            complete(&mut in_flight);
        }
        Self {
            kind: ResponseKind::Inner { body, in_flight },
        }
    }

    pub(crate) fn restore_json(body: B, in_flight: Option<InFlight>, table: Arc<Table>) -> Self {
        Self {
            kind: ResponseKind::RestoreJson {
                body,
                in_flight,
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
        in_flight: Option<InFlight>,
        table: Arc<Table>,
        awaited: Vec<IdKey>,
    ) -> Self {
        Self {
            kind: ResponseKind::RestoreSse {
                body,
                in_flight,
                table,
                rewriter: SseRewriter::awaiting(awaited),
                trailers: None,
                finished: false,
            },
        }
    }

    pub(crate) fn guard(body: Full<Bytes>) -> Self {
        Self {
            kind: ResponseKind::Guard { body },
        }
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
                in_flight,
            } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                // hyper stops polling once `is_end_stream` says so, so the end
                // is noticed here as well as on `None`.
                if frame.is_none() || body.is_end_stream() {
                    complete(in_flight);
                }
                Poll::Ready(frame.map(|frame| frame.map(into_bytes_frame)))
            }
            ResponseKindProj::RestoreJson {
                mut body,
                in_flight,
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
                            complete(in_flight);
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
                in_flight,
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
                                complete(in_flight);
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
                        complete(in_flight);
                        let rest = rewriter.finish();
                        note_restored(table, rewriter.take_restored());
                        if let Some(rest) = rest {
                            return Poll::Ready(Some(Ok(Frame::data(rest))));
                        }
                    }
                }
            },
            ResponseKindProj::Guard { body } => Pin::new(body)
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
            ResponseKind::Guard { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Inner { body, .. } => body.size_hint(),
            // The restored length is known only once rewritten.
            ResponseKind::RestoreJson { .. } | ResponseKind::RestoreSse { .. } => {
                SizeHint::default()
            }
            ResponseKind::Guard { body } => body.size_hint(),
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
