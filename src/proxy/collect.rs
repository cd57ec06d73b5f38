//! Reading a request body whole before it is forwarded, so that an answer
//! the proxy gives itself (a `502`, a `504`) can carry the request's JSON-RPC
//! id.

use std::fmt;

use bytes::Bytes;
use http::Method;
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};

use super::{BoxError, OutBody};
use crate::guard::body::Accumulated;
use crate::wire::protocol::has_media_type;

/// The largest request body the proxy reads whole to learn its JSON-RPC id
/// (the guard's default body limit).
const PEEK_LIMIT: u64 = 4 * 1024 * 1024;

/// Whether the proxy reads a request's body whole before forwarding it, to
/// have its JSON-RPC id for a `502`: a JSON POST of known length within
/// [`PEEK_LIMIT`].
pub(super) fn is_peekable<B: Body>(parts: &http::request::Parts, body: &B) -> bool {
    parts.method == Method::POST
        && has_media_type(&parts.headers, "application/json")
        && body
            .size_hint()
            .upper()
            .is_some_and(|upper| upper <= PEEK_LIMIT)
}

/// Reads a body whole; returns it again (trailers included) and its bytes,
/// from which an error answer reads the ids it carries.
///
/// What `Limited::new(body, PEEK_LIMIT).collect()` does, frame by frame and
/// with the same errors (as text), without its queue of chunks: a body the guard has
/// already read comes as one chunk, which is kept as it is.
pub(super) async fn read_whole<B>(body: B) -> Result<(OutBody, Bytes), BoxError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut read = Accumulated::default();
    let mut trailers: Option<http::HeaderMap> = None;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        match frame.map_err(Into::into)?.into_data() {
            Ok(data) => {
                if data.len() > PEEK_LIMIT as usize - read.len() {
                    return Err(TooLong.into());
                }
                if !data.is_empty() {
                    read.push(data);
                }
            }
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    match &mut trailers {
                        Some(trailers) => trailers.extend(more),
                        None => trailers = Some(more),
                    }
                }
            }
        }
    }
    let bytes = read.into_bytes();
    let body = match trailers {
        Some(trailers) => Either::Right(
            Full::new(bytes.clone())
                .map_err(|never| match never {})
                .with_trailers(async move { Some(Ok(trailers)) })
                .boxed_unsync(),
        ),
        None => Either::Left(Full::new(bytes.clone())),
    };
    Ok((body, bytes))
}

/// A body longer than its size hint promised, past [`PEEK_LIMIT`]; worded
/// as `http_body_util::LengthLimitError` (which cannot be built outside its
/// crate).
#[derive(Debug)]
struct TooLong;

impl fmt::Display for TooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("length limit exceeded")
    }
}

impl std::error::Error for TooLong {}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};
    use http_body::Frame;
    use http_body_util::{BodyExt, Limited, StreamBody};
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Piece {
        Data(Vec<u8>),
        Trailers(Vec<(&'static str, &'static str)>),
        Fails,
    }

    fn body(parts: &[Piece]) -> impl Body<Data = Bytes, Error = BoxError> + Send + 'static {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
            .iter()
            .map(|part| match part {
                Piece::Data(data) => Ok(Frame::data(Bytes::from(data.clone()))),
                Piece::Trailers(pairs) => {
                    let mut trailers = HeaderMap::new();
                    for (name, value) in pairs {
                        trailers.append(*name, HeaderValue::from_static(value));
                    }
                    Ok(Frame::trailers(trailers))
                }
                Piece::Fails => Err("the client went away".into()),
            })
            .collect();
        StreamBody::new(futures::stream::iter(frames))
    }

    /// What the proxy did before: `Limited` and `collect`.
    async fn model(parts: &[Piece]) -> Result<(Bytes, Option<HeaderMap>), String> {
        let collected = Limited::new(body(parts), PEEK_LIMIT as usize)
            .collect()
            .await
            .map_err(|error| error.to_string())?;
        let trailers = collected.trailers().cloned();
        Ok((collected.to_bytes(), trailers))
    }

    async fn fast(parts: &[Piece]) -> Result<(Bytes, Option<HeaderMap>), String> {
        let (body, bytes) = read_whole(body(parts))
            .await
            .map_err(|error| error.to_string())?;
        // What goes upstream is what was read, trailers included.
        let sent = body.collect().await.unwrap();
        let trailers = sent.trailers().cloned();
        assert_eq!(sent.to_bytes(), bytes);
        Ok((bytes, trailers))
    }

    fn part() -> impl Strategy<Value = Piece> {
        prop_oneof![
            8 => prop::collection::vec(any::<u8>(), 0..6).prop_map(Piece::Data),
            2 => prop::sample::subsequence(vec![("x-a", "1"), ("x-b", "2"), ("x-a", "3")], 0..3)
                .prop_map(Piece::Trailers),
            1 => Just(Piece::Fails),
        ]
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    proptest! {
        #[test]
        fn read_whole_matches_collect(parts in prop::collection::vec(part(), 0..6)) {
            let runtime = runtime();
            prop_assert_eq!(runtime.block_on(fast(&parts)), runtime.block_on(model(&parts)));
        }
    }

    #[test]
    fn read_whole_keeps_the_limit() {
        let runtime = runtime();
        let limit = PEEK_LIMIT as usize;
        for sizes in [
            vec![limit],
            vec![limit + 1],
            vec![limit - 1, 1],
            vec![limit - 1, 2],
            vec![1, limit],
            vec![0, limit, 0],
        ] {
            let parts: Vec<Piece> = sizes
                .iter()
                .map(|size| Piece::Data(vec![b'x'; *size]))
                .collect();
            let (fast, model) = (
                runtime.block_on(fast(&parts)),
                runtime.block_on(model(&parts)),
            );
            assert_eq!(fast.is_ok(), model.is_ok(), "{sizes:?}");
            assert_eq!(fast, model, "{sizes:?}");
        }
    }
}
