//! The response future of [`Idempotency`](crate::Idempotency).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;

/// The guarded path: validation, claim and create, boxed because it spans several awaits over
/// caller-chosen store and admission futures.
pub(crate) type Guarded<B> = Pin<Box<dyn Future<Output = Response<ResponseBody<B>>> + Send>>;

pin_project! {
    /// Response future of [`Idempotency`](crate::Idempotency).
    ///
    /// It never fails on the guarded path: every refusal, store failure and create failure is a
    /// response. Only a passed-through request can yield the inner service's error.
    pub struct ResponseFuture<F, B> {
        #[pin]
        kind: Kind<F, B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B> {
        Ready { response: Option<Response<ResponseBody<B>>> },
        PassThrough { #[pin] future: F },
        Guarded { future: Guarded<B> },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn ready(response: Response<ResponseBody<B>>) -> Self {
        Self {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn pass_through(future: F) -> Self {
        Self {
            kind: Kind::PassThrough { future },
        }
    }

    pub(crate) fn guarded(future: Guarded<B>) -> Self {
        Self {
            kind: Kind::Guarded { future },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::PassThrough { future } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(response.map(ResponseBody::inner)))
            }
            KindProj::Guarded { future } => future.as_mut().poll(cx).map(Ok),
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Ready { .. } => "Ready",
            Kind::PassThrough { .. } => "PassThrough",
            Kind::Guarded { .. } => "Guarded",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
