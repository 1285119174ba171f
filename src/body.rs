//! The request body the inner service receives and the response body the layer returns.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a request handed to the inner service.
    ///
    /// On the guarded path it holds the validated body bytes, already read (so an axum handler
    /// with `Json<LabelOperation>` works unchanged); on a passed-through path it is the
    /// original body, untouched.
    pub struct RequestBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    /// The body of a response from the layer: bytes the layer wrote (a refusal, a stored or
    /// replayed response), or the inner service's own body on a passed-through path.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full { data: Option<Bytes> },
        Inner { #[pin] body: B },
    }
}

impl<B> Kind<B> {
    fn full(data: Bytes) -> Self {
        Kind::Full {
            data: (!data.is_empty()).then_some(data),
        }
    }
}

impl<B: Body<Data = Bytes>> Kind<B> {
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Kind::Full { data } => data.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { body } => body.size_hint(),
        }
    }
}

macro_rules! body_impls {
    ($name:ident) => {
        impl<B> $name<B> {
            /// A body of exactly these bytes.
            pub fn full(data: Bytes) -> Self {
                Self {
                    kind: Kind::full(data),
                }
            }

            /// The original body, passed through untouched.
            pub fn inner(body: B) -> Self {
                Self {
                    kind: Kind::Inner { body },
                }
            }
        }

        impl<B: Body<Data = Bytes>> Body for $name<B> {
            type Data = Bytes;
            type Error = B::Error;

            fn poll_frame(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
                self.project().kind.poll_frame(cx)
            }

            fn is_end_stream(&self) -> bool {
                self.kind.is_end_stream()
            }

            fn size_hint(&self) -> SizeHint {
                self.kind.size_hint()
            }
        }

        /// An empty body, as middleware such as a timeout builds for its own replies.
        impl<B> Default for $name<B> {
            fn default() -> Self {
                Self::full(Bytes::new())
            }
        }

        impl<B> std::fmt::Debug for $name<B> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let kind = match &self.kind {
                    Kind::Full { data } => data.as_ref().map_or(0, Bytes::len).to_string(),
                    Kind::Inner { .. } => "inner".to_owned(),
                };
                f.debug_tuple(stringify!($name)).field(&kind).finish()
            }
        }
    };
}

body_impls!(RequestBody);
body_impls!(ResponseBody);
