//! The body of a client's answer: the server's as it streams, or one the layer read whole to
//! decide on it, with its trailers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower::BoxError;

pin_project! {
    /// The body a client's answer arrives in: the server's, as it streams, or the bytes and
    /// trailers of one the layer read whole to decide on it (a `409`, whose body tells a
    /// pending first attempt from a conflict; a gRPC answer, whose status is in its
    /// trailers).
    ///
    /// ```
    /// # async fn read(response: http::Response<tower_idempotency::client::ClientBody<http_body_util::Full<bytes::Bytes>>>) {
    /// use http_body_util::BodyExt;
    ///
    /// let bytes = response.into_body().collect().await.unwrap().to_bytes();
    /// # drop(bytes); }
    /// ```
    pub struct ClientBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        // The server's body, read by the caller.
        Streamed {
            #[pin]
            body: B,
        },
        // A body read whole by the layer.
        Read {
            data: Option<Bytes>,
            trailers: Option<HeaderMap>,
        },
    }
}

impl<B> ClientBody<B> {
    /// The server's body, as it streams.
    pub(crate) fn streamed(body: B) -> Self {
        Self {
            inner: Inner::Streamed { body },
        }
    }

    /// A body read whole: `data`, then `trailers` if any.
    pub(crate) fn read(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            inner: Inner::Read {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }
}

impl<B> std::fmt::Debug for ClientBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Streamed { .. } => f.write_str("ClientBody::Streamed"),
            Inner::Read { data, trailers } => f
                .debug_struct("ClientBody::Read")
                .field("bytes", &data.as_ref().map_or(0, Bytes::len))
                .field("trailers", trailers)
                .finish(),
        }
    }
}

impl<B> Body for ClientBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().inner.project() {
            InnerProj::Streamed { body } => body.poll_frame(cx).map(|frame| {
                frame.map(|frame| {
                    frame
                        .map(|frame| {
                            frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
                        })
                        .map_err(Into::into)
                })
            }),
            InnerProj::Read { data, trailers } => {
                let frame = match (data.take(), trailers.take()) {
                    (Some(data), None) => Frame::data(data),
                    (Some(data), Some(later)) => {
                        // The trailers after the data, at the next poll.
                        *trailers = Some(later);
                        Frame::data(data)
                    }
                    (None, Some(trailers)) => Frame::trailers(trailers),
                    (None, None) => return Poll::Ready(None),
                };
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Streamed { body } => body.is_end_stream(),
            Inner::Read { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Streamed { body } => body.size_hint(),
            Inner::Read { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
