//! The response future of [`Idempotency`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.Idempotency.html): a hand-written state machine.
//!
//! It drives the pipeline's steps and knows nothing of the service. A guarded request goes
//! through two states before its reply. *Reading* collects the body in place and, once the
//! body is complete, has the operation parse it and asks the store for an answer at once
//! ([`Store::claim_now`]): a replay, a conflict or a pending key (unless the layer waits for a
//! pending first attempt) is the reply, with nothing allocated for the request. *Deciding* is the claim (where the store could not answer at
//! once) and everything after it (admission, create, complete): one boxed future over the
//! caller's store, admission and inner service, allocated only for a request that goes that
//! far. If the response future is dropped while deciding (a client that went away), the
//! decision is not abandoned: it moves to a task of its own and runs to its end, so a
//! disconnect can neither strand a reservation nor cause a second create. Dropping it while
//! reading costs nothing: nothing is claimed yet.

use std::fmt;
use std::future::Future;
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
use crate::metrics::Metrics;
use crate::operation::Operation;
use crate::pipeline::Pipeline;
use tower::BoxError;

use crate::store::Store;

/// The decision of a guarded request: the claim onward, in the one allocation a request
/// makes only if it goes that far. Type-erased over the decision's future, which spans several
/// awaits over caller-chosen store, admission and inner-service futures.
type Decision<B> = Pin<Box<dyn Future<Output = Response<ResponseBody<B>>> + Send>>;

/// What a guarded request holds while its body is read.
struct Reading<S, St, O, A> {
    parts: Parts,
    pipeline: Pipeline<S, St, O, A>,
    collector: Collector,
}

pin_project! {
    /// Response future of [`Idempotency`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.Idempotency.html).
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
    pub struct ResponseFuture<S, St, O, A, ReqBody, ResBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
        ResBody: 'static,
    {
        #[pin]
        state: State<S, St, O, A, ReqBody, ResBody>,
        span: Span,
        // Whether the outcome goes into the response's extensions too.
        extension: bool,
        // The layer's series, which count the outcome.
        metrics: Metrics,
    }

    impl<S, St, O, A, ReqBody, ResBody> PinnedDrop for ResponseFuture<S, St, O, A, ReqBody, ResBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
        ResBody: 'static,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let StateProj::Deciding { decision } = this.state.project()
                && let Some(decision) = decision.take()
            {
                hand_over(decision, this.span.clone(), this.metrics.clone());
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, St, O, A, ReqBody, ResBody>
    where
        S: Service<Request<RequestBody<ReqBody>>>,
        ResBody: 'static,
    {
        Ready { response: Option<Response<ResponseBody<ResBody>>> },
        PassThrough { #[pin] future: S::Future },
        Reading { #[pin] body: ReqBody, reading: Option<Reading<S, St, O, A>> },
        Deciding { decision: Option<Decision<ResBody>> },
    }
}

/// Moves an abandoned decision to a task of its own, in the request's span; its outcome is
/// counted in the layer's series as any other.
fn hand_over<B: 'static>(decision: Decision<B>, span: Span, metrics: Metrics) {
    let decided = crate::pipeline::CLIENT_LEFT.scope((), async move {
        let response = decision.instrument(span).await;
        if let Some(outcome) = response.body().outcome() {
            metrics.outcome(outcome, response.status());
        }
    });
    crate::pipeline::spawn_or_log(
        decided,
        "the work of a response future dropped after the claim is abandoned",
    );
}

impl<S, St, O, A, ReqBody, ResBody> ResponseFuture<S, St, O, A, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
    ResBody: 'static,
{
    pub(crate) fn ready(
        response: Response<ResponseBody<ResBody>>,
        span: Span,
        extension: bool,
        metrics: Metrics,
    ) -> Self {
        Self {
            state: State::Ready {
                response: Some(response),
            },
            span,
            extension,
            metrics,
        }
    }

    pub(crate) fn pass_through(future: S::Future) -> Self {
        Self {
            state: State::PassThrough { future },
            span: Span::none(),
            extension: false,
            metrics: Metrics::default(),
        }
    }

    pub(crate) fn reading(
        body: ReqBody,
        parts: Parts,
        pipeline: Pipeline<S, St, O, A>,
        collector: Collector,
        span: Span,
        extension: bool,
        metrics: Metrics,
    ) -> Self {
        Self {
            state: State::Reading {
                body,
                reading: Some(Reading {
                    parts,
                    pipeline,
                    collector,
                }),
            },
            span,
            extension,
            metrics,
        }
    }
}

/// Records the outcome on the request's span, with one event, in the layer's series, and in
/// the response's extensions if asked to.
fn finished<B>(
    span: &Span,
    mut response: Response<ResponseBody<B>>,
    extension: bool,
    metrics: &Metrics,
) -> Response<ResponseBody<B>> {
    if let Some(outcome) = response.body().outcome() {
        metrics.outcome(outcome, response.status());
        span.record("outcome", outcome.as_str());
        tracing::debug!(outcome = %outcome, status = response.status().as_u16(), "idempotency outcome");
        if extension {
            response.extensions_mut().insert(outcome);
        }
    }
    response
}

const POLLED_AFTER_COMPLETION: &str = "ResponseFuture polled after completion";

impl<S, St, O, A, ReqBody, ResBody> Future for ResponseFuture<S, St, O, A, ReqBody, ResBody>
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
            match state.as_mut().project() {
                StateProj::Ready { response } => {
                    let response = response.take().expect(POLLED_AFTER_COMPLETION);
                    return Poll::Ready(Ok(finished(
                        span,
                        response,
                        *this.extension,
                        this.metrics,
                    )));
                }
                StateProj::PassThrough { future } => {
                    let answer = ready!(future.poll(cx));
                    // Over: polled again, it panics rather than poll the inner future again.
                    state.set(State::Ready { response: None });
                    return Poll::Ready(answer.map(|response| response.map(ResponseBody::inner)));
                }
                StateProj::Deciding { decision } => {
                    // Out of its place while polled: a decision that panics is dropped as the
                    // panic unwinds, not handed to a task on drop to be polled (and panic)
                    // again.
                    let mut taken = decision.take().expect(POLLED_AFTER_COMPLETION);
                    let Poll::Ready(response) = taken.as_mut().poll(cx) else {
                        *decision = Some(taken);
                        return Poll::Pending;
                    };
                    // Finished: nothing to hand over on drop.
                    return Poll::Ready(Ok(finished(
                        span,
                        response,
                        *this.extension,
                        this.metrics,
                    )));
                }
                StateProj::Reading { mut body, reading } => {
                    let read = {
                        let collector =
                            &mut reading.as_mut().expect(POLLED_AFTER_COMPLETION).collector;
                        loop {
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
                        }
                    };
                    let Reading {
                        parts,
                        pipeline,
                        collector,
                    } = reading.take().expect(POLLED_AFTER_COMPLETION);
                    // A reply at once is returned from here, not moved into the state first.
                    let answer = match pipeline.read(parts, collector, read) {
                        Err(response) => response,
                        Ok(claimed) => {
                            claimed.trace(span);
                            match claimed.claim_now() {
                                Err(response) => response,
                                Ok((first, reservation, in_flight)) => {
                                    state.set(State::Deciding {
                                        decision: Some(Box::pin(claimed.run::<ReqBody, ResBody>(
                                            first,
                                            reservation,
                                            in_flight,
                                        ))),
                                    });
                                    continue;
                                }
                            }
                        }
                    };
                    state.set(State::Ready { response: None });
                    return Poll::Ready(Ok(finished(span, answer, *this.extension, this.metrics)));
                }
            }
        }
    }
}

impl<S, St, O, A, ReqBody, ResBody> fmt::Debug for ResponseFuture<S, St, O, A, ReqBody, ResBody>
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
    use tower::Layer;

    use crate::MemoryStore;
    use crate::operation::LabelContract;
    use crate::operation::LabelOperation;

    /// Polls `future` once: it waits (its create never answers).
    fn poll_once<F: Future>(future: Pin<&mut F>) {
        let waker = std::task::Waker::noop();
        let polled = future.poll(&mut Context::from_waker(waker));
        assert!(polled.is_pending(), "the create never answers");
    }

    /// The size of the decision of `future`, polled until it waits for its create: the one
    /// allocation of a guarded request that goes on to create.
    fn decision_size<S, St, O, A, ReqBody, ResBody>(
        future: &ResponseFuture<S, St, O, A, ReqBody, ResBody>,
    ) -> usize
    where
        S: Service<Request<RequestBody<ReqBody>>>,
        ResBody: 'static,
    {
        let State::Deciding {
            decision: Some(decision),
        } = &future.state
        else {
            panic!("a guarded request that creates is deciding");
        };
        std::mem::size_of_val(&**decision)
    }

    /// A create service that never answers.
    fn never<B>() -> impl Service<
        Request<RequestBody<String>>,
        Response = Response<B>,
        Error = Infallible,
        Future = std::future::Pending<Result<Response<B>, Infallible>>,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(|_: Request<RequestBody<String>>| std::future::pending())
    }

    /// The one allocation of a guarded request stays small: under glibc's per-thread cache
    /// limit (1,032 bytes), so that it is served without a trip into the allocator's bins,
    /// and cheap to move into place.
    #[tokio::test]
    async fn a_created_request_is_one_small_allocation() {
        let mut service = crate::IdempotencyLayer::new(MemoryStore::new(), LabelContract)
            .global_keys()
            .layer(never::<Full<Bytes>>());
        let request = LabelOperation::new("label-req-7", "parcel-42")
            .attempt("/labels")
            .expect("a request");
        let future = service.ready().await.expect("ready").call(request);
        assert!(std::mem::size_of_val(&future) <= 512);
        let mut future = std::pin::pin!(future);
        poll_once(future.as_mut());
        let size = decision_size(future.as_ref().get_ref());
        assert!(size <= 1024, "the decision takes {size} bytes");
    }

    /// The same with an axum router inside, whose own future takes 320 bytes of it.
    #[tokio::test]
    async fn a_created_axum_request_is_one_small_allocation() {
        async fn create() -> &'static str {
            std::future::pending().await
        }
        let router = axum::Router::new().route("/labels", axum::routing::post(create));
        let mut service = crate::IdempotencyLayer::new(MemoryStore::new(), LabelContract)
            .global_keys()
            .layer(router);
        let request = LabelOperation::new("label-req-7", "parcel-42")
            .attempt("/labels")
            .expect("a request")
            .map(axum::body::Body::from);
        let future = <_ as Service<Request<axum::body::Body>>>::call(&mut service, request);
        let mut future = std::pin::pin!(future);
        poll_once(future.as_mut());
        let size = decision_size(future.as_ref().get_ref());
        assert!(size <= 1032, "the decision takes {size} bytes");
    }

    /// A replay, a conflict and a pending key (the layer not waiting for first attempts) are
    /// answered as the body ends: no decision is made, so nothing is allocated for them.
    #[tokio::test]
    async fn a_replay_a_conflict_and_a_pending_key_make_no_decision() {
        let store = MemoryStore::new();
        let created = tower::service_fn(|_: Request<RequestBody<String>>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))))
        });
        let first = LabelOperation::new("label-req-7", "parcel-42");
        let mut service = crate::IdempotencyLayer::new(store.clone(), LabelContract)
            .global_keys()
            .layer(created);
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(first.attempt("/labels").expect("a request"))
            .await
            .expect("a response");
        assert_eq!(response.status(), 200);
        // The same store behind a create that never answers: only a decision would wait.
        let mut service = crate::IdempotencyLayer::new(store, LabelContract)
            .global_keys()
            .layer(never::<Full<Bytes>>());
        let pending = LabelOperation::new("label-req-8", "parcel-42");
        let waiting = service.call(pending.attempt("/labels").expect("a request"));
        let mut waiting = std::pin::pin!(waiting);
        poll_once(waiting.as_mut());
        let waker = std::task::Waker::noop();
        for (operation, status) in [
            (first, 200),
            (LabelOperation::new("label-req-7", "parcel-43"), 409),
            (pending, 409),
        ] {
            let future = service.call(operation.attempt("/labels").expect("a request"));
            let mut future = std::pin::pin!(future);
            let polled = future.as_mut().poll(&mut Context::from_waker(waker));
            assert!(
                matches!(future.as_ref().get_ref().state, State::Ready { .. }),
                "answered without a decision"
            );
            let Poll::Ready(Ok(response)) = polled else {
                panic!("answered at its first poll");
            };
            assert_eq!(response.status(), status);
            // Answered once: polled again, it panics rather than answer twice.
            let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = future.as_mut().poll(&mut Context::from_waker(waker));
            }));
            let message = again.expect_err("polled after its answer");
            assert_polled_after_completion(&*message);
        }
        // Refusals alike: a body refused once read (400), and a request refused by its head
        // (415), answered before its body is read.
        let attempt = LabelOperation::new("label-req-9", "parcel-42");
        let mut invalid = attempt.attempt("/labels").expect("a request");
        *invalid.body_mut() = "{".to_owned();
        let mut unsupported = attempt.attempt("/labels").expect("a request");
        unsupported.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain"),
        );
        for (request, status) in [(invalid, 400), (unsupported, 415)] {
            let future = service.call(request);
            let mut future = std::pin::pin!(future);
            let polled = future.as_mut().poll(&mut Context::from_waker(waker));
            let Poll::Ready(Ok(response)) = polled else {
                panic!("refused at its first poll");
            };
            assert_eq!(response.status(), status);
            let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = future.as_mut().poll(&mut Context::from_waker(waker));
            }));
            assert_polled_after_completion(&*again.expect_err("polled after its answer"));
        }
    }

    /// A request the layer passes through is over with the inner service's answer: polled
    /// again, it panics, and does not poll the inner future again.
    #[tokio::test]
    async fn a_passed_through_request_is_over_with_its_answer() {
        use std::sync::Arc;
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&polls);
        let inner = tower::service_fn(move |_: Request<RequestBody<String>>| {
            let polls = Arc::clone(&counted);
            std::future::poll_fn(move |_| {
                polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Poll::Ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))))
            })
        });
        // A JSON operation guards POST and passes other methods through.
        let layer = crate::IdempotencyLayer::new(MemoryStore::new(), crate::JsonOperation::new())
            .global_keys();
        let mut service = tower::Layer::layer(&layer, inner);
        let request = Request::get("/payments")
            .body(String::new())
            .expect("a request");
        let future = service.call(request);
        let mut future = std::pin::pin!(future);
        let waker = std::task::Waker::noop();
        let polled = future.as_mut().poll(&mut Context::from_waker(waker));
        let Poll::Ready(Ok(response)) = polled else {
            panic!("passed through and answered at once");
        };
        assert_eq!(response.status(), 200);
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = future.as_mut().poll(&mut Context::from_waker(waker));
        }));
        assert_polled_after_completion(&*again.expect_err("polled after its answer"));
        assert_eq!(polls.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// `panic` is the panic of a future polled after its answer.
    fn assert_polled_after_completion(panic: &(dyn std::any::Any + Send)) {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied());
        assert_eq!(message, Some(POLLED_AFTER_COMPLETION));
    }
}
