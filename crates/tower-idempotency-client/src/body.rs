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
    /// trailers of one the layer read whole to decide on it. Such an answer is a `409`, whose
    /// body tells a pending first attempt from a conflict, or a gRPC answer, whose status is in
    /// its trailers.
    ///
    /// ```
    /// # async fn read(response: http::Response<tower_idempotency_client::ClientBody<http_body_util::Full<bytes::Bytes>>>) {
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
        // A body read in part by the layer: what it read, then the rest as it streams.
        Resumed {
            read: Option<Bytes>,
            rest: Pin<Box<B>>,
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

/// A body read up to a limit: whole, or over the limit and given on as it streams.
pub(super) enum ReadUpTo<B> {
    /// The whole body: its bytes and its trailers.
    Whole(Bytes, Option<HeaderMap>),
    /// Over the limit: what was read, then the rest.
    Over(ClientBody<B>),
}

/// Reads `body` whole if it is at most `limit` bytes. A longer one is read no further and given
/// on whole, what was read followed by the rest, so that an answer too long to decide on is
/// still the caller's. An error of the body is an answer cut short.
pub(super) async fn read_up_to<B>(body: B, limit: usize) -> Result<ReadUpTo<B>, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    use http_body_util::BodyExt;
    let mut body = Box::pin(body);
    let mut read = bytes::BytesMut::new();
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame.map_err(Into::into)?.into_data() {
            Ok(mut data) => {
                bytes::BufMut::put(&mut read, &mut data);
                if read.len() > limit {
                    let read = Some(read.freeze());
                    let inner = Inner::Resumed { read, rest: body };
                    return Ok(ReadUpTo::Over(ClientBody { inner }));
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(more) = frame.into_trailers() {
            match &mut trailers {
                Some(trailers) => trailers.extend(more),
                None => trailers = Some(more),
            }
        }
    }
    Ok(ReadUpTo::Whole(read.freeze(), trailers))
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
            Inner::Resumed { read, .. } => f
                .debug_struct("ClientBody::Resumed")
                .field("read", &read.as_ref().map_or(0, Bytes::len))
                .finish_non_exhaustive(),
        }
    }
}

/// A polled frame of `B`, or of this body.
type Polled<D, E> = Poll<Option<Result<Frame<D>, E>>>;

/// A frame of the server's body, as a frame of this one.
fn forward<B>(polled: Polled<B::Data, B::Error>) -> Polled<Bytes, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    polled.map(|frame| {
        frame.map(|frame| {
            frame
                .map(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining())))
                .map_err(Into::into)
        })
    })
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
            InnerProj::Streamed { body } => forward::<B>(body.poll_frame(cx)),
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
            InnerProj::Resumed { read, rest } => {
                if let Some(read) = read.take() {
                    return Poll::Ready(Some(Ok(Frame::data(read))));
                }
                forward::<B>(rest.as_mut().poll_frame(cx))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Streamed { body } => body.is_end_stream(),
            Inner::Read { data, trailers } => data.is_none() && trailers.is_none(),
            Inner::Resumed { read, rest } => read.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Streamed { body } => body.size_hint(),
            Inner::Resumed { read, rest } => {
                let read = read.as_ref().map_or(0, |read| read.len() as u64);
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
            Inner::Read { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
