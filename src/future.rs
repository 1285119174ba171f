//! The response future of [`Idempotency`](crate::Idempotency): a hand-written state machine.
//!
//! It drives the pipeline's steps and knows nothing of the service. A
//! guarded request goes through two states before its reply. *Reading* collects the body (its
//! state boxed, so that the future stays small to move) and, once the body is complete, has
//! the operation parse it. *Deciding* is the claim and everything after it (admission, create,
//! complete), one boxed future over the caller's store, admission and inner service. If the response future is dropped while
//! deciding (a client that went away), the decision is not abandoned: it moves to a task of its
//! own and runs to its end, so a disconnect can neither strand a reservation nor cause a
//! second create. Dropping it while reading costs nothing: nothing is claimed yet.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::Service;
use tracing::{Instrument, Span};

use crate::admission::Admission;
use crate::body::{self, Collector, RequestBody, ResponseBody};
use crate::operation::Operation;
use crate::pipeline::{Claimed, Guard};
use crate::store::{BoxError, Store};

/// A guarded request after its head, in one allocation for its whole life: the body's
/// reading state, then the claim and what follows (admission, create, complete) in its place.
/// Boxed, so that the response future stays small to move; type-erased over the decision's
/// future, which spans several awaits over caller-chosen store, admission and inner-service
/// futures.
type Boxed<B> = Pin<Box<dyn Guarded<B> + Send>>;

/// What the response future asks of its boxed guarded state.
trait Guarded<B> {
    /// Where the body's frames go; `None` once the body was read.
    fn collector(self: Pin<&mut Self>) -> Option<&mut Collector>;

    /// The body ended (or failed): parse it, and either start the decision in place, or give
    /// the refusal to answer.
    fn read(
        self: Pin<&mut Self>,
        read: Result<(), body::ReadError>,
        span: &Span,
    ) -> Option<Response<ResponseBody<B>>>;

    /// Polls the decision.
    fn poll_decide(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response<ResponseBody<B>>>;
}

pin_project! {
    /// The one allocation of a guarded request: `run` makes the decision from the claimed
    /// request once the body is read.
    #[project = PhaseProj]
    enum Phase<S, St, A, O, R, F>
    where
        O: Operation,
    {
        Reading { reading: Option<Reading<S, St, A, O>>, run: R },
        Deciding { #[pin] decision: F },
    }
}

/// What a guarded request holds while its body is read.
struct Reading<S, St, A, O> {
    parts: Parts,
    guard: Guard<S, St, A, O>,
    collector: Collector,
}

impl<S, St, A, O, R, F, B> Guarded<B> for Phase<S, St, A, O, R, F>
where
    O: Operation,
    R: Fn(Claimed<S, St, A, O>) -> F,
    F: Future<Output = Response<ResponseBody<B>>>,
{
    fn collector(self: Pin<&mut Self>) -> Option<&mut Collector> {
        match self.project() {
            PhaseProj::Reading { reading, .. } => reading.as_mut().map(|r| &mut r.collector),
            PhaseProj::Deciding { .. } => None,
        }
    }

    fn read(
        mut self: Pin<&mut Self>,
        read: Result<(), body::ReadError>,
        span: &Span,
    ) -> Option<Response<ResponseBody<B>>> {
        // Read once, from a fresh reading state: anything else is a poll after completion.
        let PhaseProj::Reading { reading, run } = self.as_mut().project() else {
            panic!("{POLLED_AFTER_COMPLETION}");
        };
        let Reading {
            parts,
            guard,
            collector,
        } = reading.take().expect(POLLED_AFTER_COMPLETION);
        match guard.read(parts, collector, read) {
            Ok(claimed) => {
                claimed.trace(span);
                let decision = run(claimed);
                self.set(Phase::Deciding { decision });
                None
            }
            Err(response) => Some(response),
        }
    }

    fn poll_decide(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response<ResponseBody<B>>> {
        match self.project() {
            PhaseProj::Deciding { decision } => decision.poll(cx),
            // `read` starts the decision before the response future polls it: never reached.
            PhaseProj::Reading { .. } => {
                unreachable!("a decision polled before its request's body was read")
            }
        }
    }
}

pin_project! {
    /// Response future of [`Idempotency`](crate::Idempotency).
    ///
    /// It never fails on the guarded path: every refusal, store failure and create failure is a
    /// response. Only a passed-through request can yield the inner service's error.
    ///
    /// Dropped after the claim has started, it hands the rest of the work to a Tokio task, which
    /// needs a Tokio runtime at that moment; without one the work is dropped and logged.
    ///
    /// # Panics
    ///
    /// When polled again after it returned `Poll::Ready`, like most futures.
    pub struct ResponseFuture<S, St, A, O, ReqBody, ResBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
        ResBody: 'static,
    {
        #[pin]
        state: State<S, ReqBody, ResBody>,
        span: Span,
        // Whether the outcome goes into the response's extensions too.
        extension: bool,
        // The store, admission and operation live in the boxed guarded state.
        erased: PhantomData<fn() -> (St, A, O)>,
    }

    impl<S, St, A, O, ReqBody, ResBody> PinnedDrop for ResponseFuture<S, St, A, O, ReqBody, ResBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
        ResBody: 'static,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let StateProj::Deciding { guarded } = this.state.project()
                && let Some(guarded) = guarded.take()
            {
                hand_over(guarded, this.span.clone());
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, ResBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
        ResBody: 'static,
    {
        Ready { response: Option<Response<ResponseBody<ResBody>>> },
        PassThrough { #[pin] future: S::Future },
        Reading { #[pin] body: ReqBody, guarded: Option<Boxed<ResBody>> },
        Deciding { guarded: Option<Boxed<ResBody>> },
    }
}

/// Moves an abandoned decision to a task of its own, in the request's span.
fn hand_over<B: 'static>(mut guarded: Boxed<B>, span: Span) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let decision = std::future::poll_fn(move |cx| guarded.as_mut().poll_decide(cx));
            runtime.spawn(crate::pipeline::CLIENT_LEFT.scope((), async move {
                drop(decision.instrument(span).await);
            }));
        }
        Err(_) => tracing::error!(
            "response future dropped after the claim outside a Tokio runtime; the work is abandoned"
        ),
    }
}

impl<S, St, A, O, ReqBody, ResBody> ResponseFuture<S, St, A, O, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
    ResBody: 'static,
{
    pub(crate) fn ready(
        response: Response<ResponseBody<ResBody>>,
        span: Span,
        extension: bool,
    ) -> Self {
        Self {
            state: State::Ready {
                response: Some(response),
            },
            span,
            extension,
            erased: PhantomData,
        }
    }

    pub(crate) fn pass_through(future: S::Future) -> Self {
        Self {
            state: State::PassThrough { future },
            span: Span::none(),
            extension: false,
            erased: PhantomData,
        }
    }

    pub(crate) fn reading(
        body: ReqBody,
        parts: Parts,
        guard: Guard<S, St, A, O>,
        collector: Collector,
        span: Span,
        extension: bool,
    ) -> Self
    where
        S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Send + 'static,
        S::Future: Send + 'static,
        St: Store,
        A: Admission<O::Value>,
        O: Operation,
        ReqBody: 'static,
        ResBody: Body<Data = Bytes> + Send + 'static,
    {
        let phase = Phase::Reading {
            reading: Some(Reading {
                parts,
                guard,
                collector,
            }),
            run: Claimed::run::<ReqBody, ResBody>,
        };
        Self {
            state: State::Reading {
                body,
                guarded: Some(Box::pin(phase)),
            },
            span,
            extension,
            erased: PhantomData,
        }
    }
}

/// Records the outcome on the request's span, with one event, and in the response's
/// extensions if asked to.
fn finished<B>(
    span: &Span,
    mut response: Response<ResponseBody<B>>,
    extension: bool,
) -> Response<ResponseBody<B>> {
    if let Some(outcome) = response.body().outcome() {
        span.record("outcome", outcome.as_str());
        tracing::debug!(outcome = %outcome, status = response.status().as_u16(), "idempotency outcome");
        if extension {
            response.extensions_mut().insert(outcome);
        }
    }
    response
}

const POLLED_AFTER_COMPLETION: &str = "ResponseFuture polled after completion";

impl<S, St, A, O, ReqBody, ResBody> Future for ResponseFuture<S, St, A, O, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    St: Store,
    A: Admission<O::Value>,
    O: Operation,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let span: &Span = this.span;
            let _entered = span.enter();
            let mut state = this.state;
            let next = match state.as_mut().project() {
                StateProj::Ready { response } => {
                    let response = response.take().expect(POLLED_AFTER_COMPLETION);
                    return Poll::Ready(Ok(finished(span, response, *this.extension)));
                }
                StateProj::PassThrough { future } => {
                    let response = ready!(future.poll(cx))?;
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
                StateProj::Deciding { guarded } => {
                    // Out of its place while polled: a decision that panics is dropped as the
                    // panic unwinds, not handed to a task on drop to be polled (and panic)
                    // again.
                    let mut decision = guarded.take().expect(POLLED_AFTER_COMPLETION);
                    let Poll::Ready(response) = decision.as_mut().poll_decide(cx) else {
                        *guarded = Some(decision);
                        return Poll::Pending;
                    };
                    // Finished: nothing to hand over on drop.
                    return Poll::Ready(Ok(finished(span, response, *this.extension)));
                }
                StateProj::Reading { mut body, guarded } => {
                    let boxed = guarded.as_mut().expect(POLLED_AFTER_COMPLETION);
                    let read = loop {
                        let collector = boxed.as_mut().collector().expect(POLLED_AFTER_COMPLETION);
                        match ready!(body.as_mut().poll_frame(cx)) {
                            None => break Ok(()),
                            Some(Err(error)) => break Err(body::body_error(error)),
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data()
                                    && let Err(error) = collector.push(data)
                                {
                                    break Err(error);
                                }
                            }
                        }
                    };
                    let mut boxed = guarded.take().expect(POLLED_AFTER_COMPLETION);
                    match boxed.as_mut().read(read, span) {
                        None => State::Deciding {
                            guarded: Some(boxed),
                        },
                        Some(response) => State::Ready {
                            response: Some(response),
                        },
                    }
                }
            };
            state.set(next);
        }
    }
}

impl<S, St, A, O, ReqBody, ResBody> fmt::Debug for ResponseFuture<S, St, A, O, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
    ResBody: 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Ready { .. } => "Ready",
            State::PassThrough { .. } => "PassThrough",
            State::Reading { .. } => "Reading",
            State::Deciding { .. } => "Deciding",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::Full;
    use tower::ServiceExt;

    use super::*;
    use crate::{Idempotency, LabelOperation, MemoryStore};

    /// The size of a guarded request's one allocation.
    fn guarded_size<S, St, A, O, ReqBody, ResBody>(
        future: &ResponseFuture<S, St, A, O, ReqBody, ResBody>,
    ) -> usize
    where
        S: Service<Request<RequestBody<ReqBody>>>,
        ResBody: 'static,
    {
        let State::Reading {
            guarded: Some(guarded),
            ..
        } = &future.state
        else {
            panic!("a guarded request starts by reading its body");
        };
        std::mem::size_of_val(&**guarded)
    }

    /// The one allocation of a guarded request stays small: under glibc's per-thread cache
    /// limit (1,032 bytes), so that it is served without a trip into the allocator's bins,
    /// and cheap to move while the decision is built in its place.
    #[tokio::test]
    async fn a_guarded_request_is_one_small_allocation() {
        let create = tower::service_fn(|_: Request<RequestBody<String>>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))))
        });
        let mut service = Idempotency::new(create, MemoryStore::new());
        let request = LabelOperation::new("label-req-7", "parcel-42")
            .attempt("/labels")
            .expect("a request");
        let future = service.ready().await.expect("ready").call(request);
        let size = guarded_size(&future);
        assert!(size <= 1024, "the guarded state takes {size} bytes");
        assert!(std::mem::size_of_val(&future) <= 256);
        let response = future.await.expect("a response");
        assert_eq!(response.status(), 200);
    }

    /// The same with an axum router inside, whose own future takes 320 bytes of it.
    #[tokio::test]
    async fn a_guarded_axum_request_is_one_small_allocation() {
        async fn create() -> &'static str {
            "{}"
        }
        let router = axum::Router::new().route("/labels", axum::routing::post(create));
        let mut service = Idempotency::new(router, MemoryStore::new());
        let request = LabelOperation::new("label-req-7", "parcel-42")
            .attempt("/labels")
            .expect("a request")
            .map(axum::body::Body::from);
        let future = <_ as Service<Request<axum::body::Body>>>::call(&mut service, request);
        let size = guarded_size(&future);
        assert!(size <= 1032, "the guarded state takes {size} bytes");
        let response = future.await.expect("a response");
        assert_eq!(response.status(), 200);
    }
}
