//! The request body the inner service receives, the response body the layer returns, and the
//! one loop that collects a body up to a limit.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http::header::CONTENT_LENGTH;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::outcome::Outcome;
use tower::BoxError;

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
        outcome: Option<Outcome>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full { data: Option<Bytes>, trailers: Option<Box<HeaderMap>> },
        Inner { #[pin] body: B },
        // A body read in part, past the cap: what was read, then the rest of it. Boxed, so
        // that it could be moved out of the read that began it, and so that every response
        // body holds one pointer for it.
        Resumed { rest: Pin<Box<Rest<B>>> },
    }
}

pin_project! {
    /// A body read in part: what was read of it, then the body itself.
    pub(crate) struct Rest<B> {
        read: [Option<Bytes>; 2],
        #[pin]
        body: B,
    }
}

impl<B> Kind<B> {
    fn full(data: Bytes) -> Self {
        Kind::Full {
            data: (!data.is_empty()).then_some(data),
            trailers: None,
        }
    }
}

impl<B: Body<Data = Bytes>> Kind<B> {
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            KindProj::Full { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(|t| Frame::trailers(*t)))
                    .map(Ok),
            ),
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Resumed { rest } => {
                let rest = rest.as_mut().project();
                match rest.read.iter_mut().find_map(Option::take) {
                    Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    None => rest.body.poll_frame(cx),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Resumed { rest } => {
                rest.read.iter().all(Option::is_none) && rest.body.is_end_stream()
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Kind::Full { data, trailers } => {
                let len = data.as_ref().map_or(0, |d| d.len() as u64);
                // A body with trailers is not of a known length: over HTTP/1.1 a length would
                // leave no room for them (hyper sends trailers only when chunked), and
                // tonic-web, which writes them into the body, keeps the hint it is given.
                match trailers {
                    None => SizeHint::with_exact(len),
                    Some(_) => {
                        let mut hint = SizeHint::new();
                        hint.set_lower(len);
                        hint
                    }
                }
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Resumed { rest } => {
                let read = rest.read.iter().flatten().map(|d| d.len() as u64);
                let read = read.sum::<u64>();
                let rest = rest.body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
        }
    }
}

macro_rules! body_impls {
    ($name:ident { $($field:ident: $value:expr),* }) => {
        impl<B> $name<B> {
            /// A body of exactly these bytes.
            pub fn full(data: Bytes) -> Self {
                Self {
                    kind: Kind::full(data),
                    $($field: $value),*
                }
            }

            /// The original body, passed through untouched.
            pub fn inner(body: B) -> Self {
                Self {
                    kind: Kind::Inner { body },
                    $($field: $value),*
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
                    Kind::Full { data, .. } => data.as_ref().map_or(0, Bytes::len).to_string(),
                    Kind::Inner { .. } | Kind::Resumed { .. } => "inner".to_owned(),
                };
                f.debug_tuple(stringify!($name)).field(&kind).finish()
            }
        }
    };
}

body_impls!(RequestBody {});
body_impls!(ResponseBody { outcome: None });

impl<B> ResponseBody<B> {
    /// What the layer did with the request this body answers; `None` on a passed-through
    /// request. An outer layer that sees the response before its body is replaced reads it
    /// here, for free; after (an axum middleware, say), from the response extensions with
    /// [`IdempotencyLayer::outcome_extension`](crate::IdempotencyLayer::outcome_extension).
    ///
    /// ```
    /// use http::{Request, Response};
    /// use tower::{ServiceExt, service_fn};
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::layer::Idempotency;
    /// use tower_idempotency::reply::Outcome;
    /// use tower_idempotency::layer::RequestBody;
    /// use tower_idempotency::operation::LabelOperation;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let create = service_fn(|_: Request<RequestBody<String>>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::builder().status(201).body(String::new()).unwrap())
    /// });
    /// let service = tower::Layer::layer(&tower_idempotency::IdempotencyLayer::new(MemoryStore::new(), tower_idempotency::operation::LabelContract).global_keys(), create);
    /// let op = LabelOperation::new("label-req-7", "parcel-42");
    /// let first = service.clone().oneshot(op.attempt("/labels").unwrap()).await.unwrap();
    /// let again = service.oneshot(op.attempt("/labels").unwrap()).await.unwrap();
    /// assert_eq!(first.body().outcome(), Some(Outcome::Created));
    /// assert_eq!(again.body().outcome(), Some(Outcome::Replay));
    /// # }
    /// ```
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// A body of exactly these bytes, then these trailers.
    pub(crate) fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        let mut body = Self::full(data);
        if let Kind::Full { trailers: slot, .. } = &mut body.kind {
            *slot = trailers.map(Box::new);
        }
        body
    }

    /// This body, answering with `outcome`.
    pub(crate) fn with_outcome(mut self, outcome: Outcome) -> Self {
        self.outcome = Some(outcome);
        self
    }
}

/// The body limit, at once: a declared `Content-Length` over the limit.
pub(crate) fn declares_over(headers: &HeaderMap, limit: usize) -> bool {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|len| len > limit as u64)
}

/// Why reading a body at most `limit` long failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// More than `limit` bytes arrived.
    TooLarge,
    /// The body stream failed (a client that went away, say).
    Broken,
}

/// Collects body frames up to a limit, never holding more than the limit plus the frame that
/// went over it. A body that arrives in one frame is kept without a copy.
#[derive(Debug)]
pub(crate) struct Collector {
    first: Option<Bytes>,
    joined: Option<BytesMut>,
    len: usize,
    limit: usize,
}

impl Collector {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            first: None,
            joined: None,
            len: 0,
            limit,
        }
    }

    /// Adds one data frame.
    pub(crate) fn push(&mut self, data: Bytes) -> Result<(), ReadError> {
        self.len = self.len.saturating_add(data.len());
        if self.len > self.limit {
            return Err(ReadError::TooLarge);
        }
        if data.is_empty() {
            return Ok(());
        }
        match (&mut self.first, &mut self.joined) {
            (None, None) => self.first = Some(data),
            (Some(head), None) => {
                let capacity = self.len.max(head.len() * 2).min(self.limit);
                let mut buffer = BytesMut::with_capacity(capacity);
                buffer.extend_from_slice(head);
                buffer.extend_from_slice(&data);
                self.first = None;
                self.joined = Some(buffer);
            }
            (_, Some(buffer)) => buffer.extend_from_slice(&data),
        }
        Ok(())
    }

    /// Whether `len` more bytes stay within the limit.
    pub(crate) fn fits(&self, len: usize) -> bool {
        self.len.saturating_add(len) <= self.limit
    }

    /// The whole body.
    pub(crate) fn finish(self) -> Bytes {
        match (self.first, self.joined) {
            (_, Some(buffer)) => buffer.freeze(),
            (Some(head), None) => head,
            (None, None) => Bytes::new(),
        }
    }
}

/// Why a request body stream failed: a length limit of a layer in front (anywhere in the error's
/// chain) is "too large"; anything else is a broken body.
pub(crate) fn body_error(error: impl Into<BoxError>) -> ReadError {
    let error = error.into();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
    while let Some(current) = cause {
        if current.is::<http_body_util::LengthLimitError>() {
            return ReadError::TooLarge;
        }
        cause = current.source();
    }
    ReadError::Broken
}

pin_project! {
    #[project = SourceProj]
    enum Source<B> {
        // A body whose size hint says it fits: read where it is.
        Fits { #[pin] body: B },
        // A body that may not fit: boxed, so that past the cap it moves on to the reply.
        Open { rest: Option<Pin<Box<Rest<B>>>> },
    }
}

/// What [`ReadLimited`] read.
pub(crate) enum Read<B> {
    /// The whole body, and its trailers.
    Whole(Bytes, Option<HeaderMap>),
    /// More than the cap: what was read, and the body still to read.
    Over(ResponseBody<B>),
    /// The body failed, or went past the cap its size hint said it fits in.
    Failed(ReadError),
}

pin_project! {
    /// Reads a whole body of at most `limit` bytes with a [`Collector`], and its trailers: the
    /// created response. A future of its own rather than an `async fn`, so that the decision
    /// that awaits it holds the body once.
    ///
    /// A body whose size hint bounds it within the limit (a created response almost always
    /// is: its length is known) is read where it is. Any other is boxed first, so that one
    /// that goes past the limit is handed back whole, what was read and the rest of it, to
    /// be given to the client rather than dropped.
    pub(crate) struct ReadLimited<B> {
        #[pin]
        source: Source<B>,
        collector: Option<Collector>,
        // Boxed: only a gRPC reply has them, and every decision would hold room for a map.
        trailers: Option<Box<HeaderMap>>,
    }
}

impl<B: Body> ReadLimited<B> {
    pub(crate) fn new(body: B, limit: usize) -> Self {
        let fits = body
            .size_hint()
            .upper()
            .is_some_and(|upper| upper <= limit as u64);
        let source = if fits {
            Source::Fits { body }
        } else {
            Source::Open {
                rest: Some(Box::pin(Rest {
                    read: [None, None],
                    body,
                })),
            }
        };
        Self {
            source,
            collector: Some(Collector::new(limit)),
            trailers: None,
        }
    }
}

impl<B: Body<Data = Bytes>> Future for ReadLimited<B> {
    type Output = Read<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(collector) = this.collector.as_mut() else {
            panic!("ReadLimited polled after completion");
        };
        loop {
            let polled = match this.source.as_mut().project() {
                SourceProj::Fits { body } => body.poll_frame(cx),
                SourceProj::Open { rest: Some(rest) } => {
                    rest.as_mut().project().body.poll_frame(cx)
                }
                SourceProj::Open { rest: None } => {
                    panic!("ReadLimited polled after completion")
                }
            };
            let Some(frame) = std::task::ready!(polled) else {
                break;
            };
            let pushed = match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) if !collector.fits(data.len()) => {
                        let read = this
                            .collector
                            .take()
                            .map(Collector::finish)
                            .filter(|read| !read.is_empty());
                        return Poll::Ready(match this.source.as_mut().project() {
                            SourceProj::Open { rest } => match rest.take() {
                                Some(mut rest) => {
                                    *rest.as_mut().project().read = [read, Some(data)];
                                    Read::Over(ResponseBody {
                                        kind: Kind::Resumed { rest },
                                        outcome: None,
                                    })
                                }
                                None => Read::Failed(ReadError::Broken),
                            },
                            // Its size hint said it fits: a body that lies about its size.
                            SourceProj::Fits { .. } => Read::Failed(ReadError::TooLarge),
                        });
                    }
                    Ok(data) => collector.push(data),
                    Err(frame) => {
                        // Every value of every trailers frame, in order (an HTTP/2 server
                        // writes one).
                        if let Ok(more) = frame.into_trailers() {
                            let trailers = this.trailers.get_or_insert_with(Box::default);
                            for (name, value) in &more {
                                trailers.append(name.clone(), value.clone());
                            }
                        }
                        Ok(())
                    }
                },
                Err(_) => Err(ReadError::Broken),
            };
            if let Err(error) = pushed {
                // Done: a later poll is one after completion, not a second read.
                *this.collector = None;
                return Poll::Ready(Read::Failed(error));
            }
        }
        let body = this
            .collector
            .take()
            .map(Collector::finish)
            .unwrap_or_default();
        Poll::Ready(Read::Whole(
            body,
            this.trailers.take().map(|trailers| *trailers),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_full_body_ends_after_its_data_and_its_trailers() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let mut body = std::pin::pin!(
            ResponseBody::<http_body_util::Empty<Bytes>>::full_with_trailers(
                Bytes::from_static(b"message"),
                Some(trailers.clone()),
            )
        );
        assert!(!body.is_end_stream());
        let Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut cx) else {
            panic!("the data first")
        };
        assert_eq!(frame.into_data().unwrap(), "message");
        assert!(!body.is_end_stream(), "the trailers are still to come");
        let Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut cx) else {
            panic!("then the trailers")
        };
        assert_eq!(frame.into_trailers().unwrap(), trailers);
        assert!(body.is_end_stream());
        assert!(matches!(
            body.as_mut().poll_frame(&mut cx),
            Poll::Ready(None)
        ));

        let empty = ResponseBody::<http_body_util::Empty<Bytes>>::full(Bytes::new());
        assert!(empty.is_end_stream());
        let data = ResponseBody::<http_body_util::Empty<Bytes>>::full(Bytes::from_static(b"x"));
        assert!(!data.is_end_stream());
        let only_trailers = ResponseBody::<http_body_util::Empty<Bytes>>::full_with_trailers(
            Bytes::new(),
            Some(trailers),
        );
        assert!(!only_trailers.is_end_stream());
    }

    /// A body of the given frames, in order.
    struct Frames(std::collections::VecDeque<Result<Frame<Bytes>, std::io::Error>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    /// A body that fails is read once: polled again, the reading is over, not started anew.
    #[test]
    fn a_failed_read_is_over() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let failing = Frames(
            [
                Ok(Frame::data(Bytes::from_static(b"part"))),
                Err(std::io::Error::other("cut")),
                Ok(Frame::data(Bytes::from_static(b"more"))),
            ]
            .into(),
        );
        let mut read = std::pin::pin!(ReadLimited::new(failing, 100));
        assert!(matches!(
            read.as_mut().poll(&mut cx),
            Poll::Ready(Read::Failed(ReadError::Broken))
        ));
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            read.as_mut().poll(&mut cx).is_ready()
        }));
        assert!(again.is_err(), "a poll after completion");
    }

    /// A body past the cap is handed back whole: what was read, the frame that went past,
    /// then the rest, and its trailers; a body whose size hint lied about fitting is refused.
    #[test]
    fn a_body_past_the_cap_is_handed_back_whole() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let frames = || {
            Frames(
                [
                    Ok(Frame::data(Bytes::from_static(b"abc"))),
                    Ok(Frame::data(Bytes::from_static(b"def"))),
                    Ok(Frame::data(Bytes::from_static(b"ghij"))),
                    Ok(Frame::data(Bytes::from_static(b"kl"))),
                    Ok(Frame::trailers(trailers.clone())),
                ]
                .into(),
            )
        };
        let mut read = std::pin::pin!(ReadLimited::new(frames(), 8));
        let Poll::Ready(Read::Over(body)) = read.as_mut().poll(&mut cx) else {
            panic!("past the cap")
        };
        assert_eq!(body.size_hint().lower(), 10);
        assert!(!body.is_end_stream());
        let mut body = std::pin::pin!(body);
        let mut data = Vec::new();
        let mut got_trailers = None;
        while let Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut cx) {
            match frame.into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => got_trailers = frame.into_trailers().ok(),
            }
            if data.len() < 12 {
                // What was read given, the rest of the body still to come.
                assert!(!body.is_end_stream(), "{} bytes given", data.len());
            }
        }
        assert_eq!(data, b"abcdefghijkl");
        assert_eq!(got_trailers, Some(trailers.clone()));
        assert!(matches!(
            body.as_mut().poll_frame(&mut cx),
            Poll::Ready(None)
        ));

        // Exactly at the cap: whole.
        let mut read = std::pin::pin!(ReadLimited::new(frames(), 12));
        let Poll::Ready(Read::Whole(whole, Some(_))) = read.as_mut().poll(&mut cx) else {
            panic!("whole at the cap")
        };
        assert_eq!(whole, "abcdefghijkl");

        /// A body that says it has at most one byte.
        struct Lying(Frames);
        impl Body for Lying {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
                Pin::new(&mut self.0).poll_frame(cx)
            }
            fn size_hint(&self) -> SizeHint {
                SizeHint::with_exact(1)
            }
        }
        let mut read = std::pin::pin!(ReadLimited::new(Lying(frames()), 8));
        assert!(matches!(
            read.as_mut().poll(&mut cx),
            Poll::Ready(Read::Failed(ReadError::TooLarge))
        ));
    }

    #[test]
    fn declared_length() {
        let mut headers = HeaderMap::new();
        assert!(!declares_over(&headers, 4096));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("4096"));
        assert!(!declares_over(&headers, 4096));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("4097"));
        assert!(declares_over(&headers, 4096));
    }
}
