//! [`ProtectedBody`]: the response body the protection layers share.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project::pin_project;

/// The response body of the protection layers: the inner service's body, or
/// the layer's own refusal. The inner body's error type is kept.
#[pin_project]
#[derive(Debug)]
pub struct ProtectedBody<B> {
    #[pin]
    content: Content<B>,
}

#[pin_project(project = ContentProj)]
#[derive(Debug)]
enum Content<B> {
    Inner {
        #[pin]
        body: B,
    },
    Refusal {
        body: Full<Bytes>,
    },
}

impl<B> ProtectedBody<B> {
    /// The inner service's body, passed on unchanged.
    pub(crate) fn inner(body: B) -> Self {
        Self {
            content: Content::Inner { body },
        }
    }

    /// A refusal the layer produced itself.
    pub(crate) fn refusal(body: Full<Bytes>) -> Self {
        Self {
            content: Content::Refusal { body },
        }
    }
}

impl<B> ProtectedBody<ProtectedBody<B>> {
    /// One body for two stacked layers' (the bundle's): an outer refusal
    /// stays a refusal, an outer pass-through is the inner layer's body.
    pub(crate) fn flatten(self) -> ProtectedBody<B> {
        match self.content {
            Content::Inner { body } => body,
            Content::Refusal { body } => ProtectedBody::refusal(body),
        }
    }
}

/// Empty, as tower-http's `TimeoutLayer` builds its own `408` from it.
impl<B> Default for ProtectedBody<B> {
    fn default() -> Self {
        Self::refusal(Full::default())
    }
}

impl<B> Body for ProtectedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().content.project() {
            ContentProj::Inner { body } => body.poll_frame(cx),
            ContentProj::Refusal { body } => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.content {
            Content::Inner { body } => body.is_end_stream(),
            Content::Refusal { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.content {
            Content::Inner { body } => body.size_hint(),
            Content::Refusal { body } => body.size_hint(),
        }
    }
}
