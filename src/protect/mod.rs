//! Protections for an MCP server facing the network, each a tower layer that
//! composes with [`IdGuardLayer`](crate::IdGuardLayer) through
//! `ServiceBuilder` or axum's `.layer()`, in front of an rmcp service, an axum
//! router or the [`proxy`](crate::proxy).
//!
//! Each layer answers what it refuses itself, with a precise HTTP status and
//! a JSON-RPC error, and marks that response with a [`Refused`] extension so
//! that a layer outside it (metrics) can count refusals by kind. Their
//! responses share one body type, [`ProtectedBody`], which keeps the inner
//! body's error type.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project::pin_project;

pub mod metrics;
#[cfg(feature = "proxy")]
pub(crate) mod upstream;

/// Why a protection layer answered a request itself. Put on the response it
/// gave as an extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refused {
    /// `Host` names no authority the server is reached by (421).
    Host,
    /// `Origin` is a foreign web page's (403).
    Origin,
    /// The request head is over its limit (431).
    HeadSize,
    /// The request body paused longer than its idle limit (408).
    BodyIdle,
    /// The request body arrived slower than the minimum data rate (408).
    BodySlow,
    /// The request arrived on a connection that is closing (503).
    ConnectionClosing,
}

impl Refused {
    /// The kind's label in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Origin => "origin",
            Self::HeadSize => "header_size",
            Self::BodyIdle => "body_idle",
            Self::BodySlow => "body_slow",
            Self::ConnectionClosing => "connection_closing",
        }
    }
}

/// The response body of the protection layers: the inner service's body, or
/// the layer's own refusal. The inner body's error type is kept.
#[pin_project]
#[derive(Debug)]
pub struct ProtectedBody<B> {
    #[pin]
    content: Content<B>,
}

#[allow(dead_code)]
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

// The layers that use these come next; this attribute goes with them.
#[allow(dead_code)]
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
