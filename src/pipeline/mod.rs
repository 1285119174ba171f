//! The steps of a guarded request, in order, one function each:
//!
//! 1. [`head`]: the path, the operation's head checks, a declared length over the limit;
//! 2. the body, read up to the limit by the response future ([`Collector`]), then
//!    [`Pipeline::read`];
//! 3. [`Pipeline::operation`]: the operation parsed, the scope, the store key;
//! 4. the claim: at once in [`Validated::claim_now`] where the store answers without waiting (a
//!    replay, a conflict or a pending key is then the reply, and no decision is made), else
//!    [`claim`] (and the wait for a pending first attempt, if configured);
//! 5. [`admit`] (a refusal releases);
//! 6. [`create`];
//! 7. [`keep`] and [`collect`]: the created response, read whole;
//! 8. [`complete`], and only then the reply.
//!
//! Steps 4 (unless the claim was answered at once) to 8 are the decision, [`Validated::run`].
//!
//! Nothing refused before step 4 touches the store, admission or the inner service.
//!
//! Steps that take the request's pieces by value ([`Validated::run`], [`finish`], [`create`],
//! [`collect`]) are plain functions that return their future, not `async fn`s: an `async fn`
//! keeps its arguments in its state beside the values it moves out of them, so each piece
//! would be held twice, in the one allocation a request that creates makes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::Service;

mod futures;
mod response;
mod settle;
mod wait;

/// Runs `task` in a task of its own on the current Tokio runtime, so that it outlives the
/// request; outside one it cannot run, and the error log says what is not done: `undone`.
pub(crate) fn spawn_or_log(task: impl Future<Output = ()> + Send + 'static, undone: &'static str) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(task)),
        Err(_) => tracing::error!("no Tokio runtime: {undone}"),
    }
}

use self::futures::{CatchUnwind, renewing};
use self::response::{Collected, Keep, collect, keep};
use self::settle::{Settle, Unsettled, is_unknown, release, settle};
pub(crate) use self::wait::CLIENT_LEFT;
use self::wait::wait_for_first;
use crate::admission::{Admission, Admit};
use crate::body::{self, Collector, ReadError, RequestBody, ResponseBody};
use crate::drain::InFlight;
use crate::headers;
use crate::metrics::{Call, Started};
use crate::operation::{Fingerprint, Head, Operation, Parsed};
use crate::reply::{self, IDEMPOTENT_REPLAYED, Outcome, Rejection};
use crate::scope::KeyBuf;
use crate::settings::{OtherPaths, Settings, StoredResponses};
use crate::store::{Claim, Reservation, Store, StoreError, StoreErrorKind, StoredResponse};
use crate::tally::Tally;

/// Step 1: the path, the operation's checks of the head, and a declared length over the limit.
pub(crate) fn head<O: Operation>(settings: &Settings<O>, parts: &Parts) -> Head {
    if let Some(path) = &settings.path
        && parts.uri.path() != path
    {
        return match settings.config.other_paths {
            OtherPaths::PassThrough => Head::PassThrough,
            OtherPaths::NotFound => Head::Reject(Rejection::NotFound),
        };
    }
    match settings.operation.head(parts) {
        Head::Guard if body::declares_over(&parts.headers, settings.body_limit) => {
            Head::Reject(Rejection::PayloadTooLarge)
        }
        head => head,
    }
}

/// Step 2, once the body stream ended: the whole body, or why it is refused.
fn read(collector: Collector, read: Result<(), ReadError>) -> Result<Bytes, Rejection> {
    match read {
        Ok(()) => Ok(collector.finish()),
        Err(ReadError::TooLarge) => Err(Rejection::PayloadTooLarge),
        Err(ReadError::Broken) => Err(Rejection::invalid("the body could not be read")),
    }
}

/// Everything a guarded request needs after its head passed, moved into its future.
pub(crate) struct Pipeline<S, St, O, A> {
    pub(crate) inner: S,
    pub(crate) store: St,
    pub(crate) admission: A,
    pub(crate) settings: Arc<Settings<O>>,
}

impl<S, St, O: Operation, A> Pipeline<S, St, O, A> {
    /// Steps 2 and 3, once the body stream ended: the body, then the operation, its scope and
    /// its store key; a refusal is the operation's response. Nothing is claimed until the body
    /// is complete and valid, so a slow or stalled body holds no reservation.
    // Either variant moves once, into the future's next state: boxing the response would cost
    // an allocation per refusal.
    #[allow(clippy::result_large_err)]
    pub(crate) fn read<B>(
        self,
        parts: Parts,
        collector: Collector,
        result: Result<(), ReadError>,
    ) -> Result<Validated<S, St, O, A>, Response<ResponseBody<B>>> {
        let operation = read(collector, result).and_then(|body| {
            let (key, fingerprint, value) = self.operation(&parts, &body)?;
            Ok((key, fingerprint, value, body))
        });
        match operation {
            Ok((key, fingerprint, value, body)) => Ok(Validated {
                pipeline: self,
                key,
                fingerprint,
                value,
                parts,
                body,
            }),
            Err(rejection) => Err(self.settings.refuse(rejection)),
        }
    }

    /// Step 3: the operation's key (within the scope, the method and the path), fingerprint
    /// and value.
    fn operation(
        &self,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<(KeyBuf, Fingerprint, O::Value), Rejection> {
        let Parsed {
            key,
            fingerprint,
            value,
        } = self.settings.operation.parse(parts, body)?;
        let scope = match &self.settings.config.scope {
            Some(scope) => Some((scope.0)(parts).ok_or(Rejection::ScopeRequired)?),
            None => None,
        };
        let key = KeyBuf::new(scope.as_deref(), &parts.method, parts.uri.path(), &key);
        Ok((key, fingerprint, value))
    }
}

/// A valid request about to be claimed.
pub(crate) struct Validated<S, St, O: Operation, A> {
    pipeline: Pipeline<S, St, O, A>,
    key: KeyBuf,
    fingerprint: Fingerprint,
    value: O::Value,
    parts: Parts,
    body: Bytes,
}

impl<S, St, O: Operation, A> Validated<S, St, O, A> {
    /// Records the fingerprint, and the key if configured, on the request's span.
    pub(crate) fn trace(&self, span: &tracing::Span) {
        if span.is_disabled() {
            return;
        }
        span.record("fingerprint", self.fingerprint.to_hex().as_str());
        if self.pipeline.settings.config.trace_keys {
            span.record("key", self.key.as_str());
        }
    }

    /// Step 4 at once, where the store answers without waiting ([`Store::claim_now`]): a
    /// replay, a conflict, a pending key (unless the layer waits for pending first attempts)
    /// or a failure is the reply, with no decision made; a new claim, or a pending key to wait
    /// for, is where the decision starts. A store that must wait leaves the claim to the
    /// decision.
    // The reply moves once, into the future's next state: boxing it would cost an allocation
    // per replay.
    #[allow(clippy::result_large_err)]
    pub(crate) fn claim_now<B>(
        &self,
    ) -> Result<(First, Reservation, Option<InFlight>), Response<ResponseBody<B>>>
    where
        St: Store,
    {
        let Pipeline {
            store, settings, ..
        } = &self.pipeline;
        // A closing server claims nothing new; what is past its claim is counted until done.
        let in_flight = match &settings.config.drain {
            None => None,
            Some(drain) => match drain.enter() {
                Some(in_flight) => Some(in_flight),
                None => {
                    tracing::info!("draining: the request is refused before its claim");
                    return Err(settings.refuse(Rejection::StoreUnavailable));
                }
            },
        };
        let (key, fingerprint) = (self.key.as_str(), &self.fingerprint);
        let reservation = Reservation::generate();
        let started = Started::now();
        let Some(answer) = store.claim_now(key, fingerprint, reservation, settings.config.lease)
        else {
            return Ok((First::Claim, reservation, in_flight));
        };
        settings.config.metrics.store_call(Call::Claim, started);
        if let (Ok(Claim::Pending), Some(_)) = (&answer, settings.config.pending_wait) {
            return Ok((First::Wait, reservation, in_flight));
        }
        answered(answer, store, key, fingerprint, reservation, settings)
            .map(|reservation| (First::New, reservation, in_flight))
    }

    /// Steps 4 (unless the claim was made at once) to 8: claim, admit,
    /// create, complete, and only then reply.
    ///
    /// The request's pieces are the decision's own captures, each held once (see the module),
    /// and what the create takes is taken from its place when the create starts.
    pub(crate) fn run<ReqBody, ResBody>(
        self,
        first: First,
        mut reservation: Reservation,
        in_flight: Option<InFlight>,
    ) -> impl Future<Output = Response<ResponseBody<ResBody>>>
    where
        S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
        St: Store,
        A: Admission<O::Value>,
        ResBody: Body<Data = Bytes>,
    {
        let Self {
            pipeline:
                Pipeline {
                    inner,
                    store,
                    admission,
                    settings,
                },
            key,
            fingerprint,
            value,
            parts,
            body,
        } = self;
        let mut input = Some(CreateInput {
            inner,
            parts,
            body,
            value,
        });
        async move {
            // The key is read where it is (`key.as_str()` at each use): a `&str` held across
            // the awaits would take a fat pointer's room in every state of the decision.
            // The reservation is the decision's own, where it stays: every step after the
            // claim refers to it.
            if !matches!(first, First::New) {
                match claim(
                    &store,
                    key.as_str(),
                    &fingerprint,
                    reservation,
                    &settings,
                    first,
                )
                .await
                {
                    Ok(held) => reservation = held,
                    Err(response) => return response,
                }
            }
            // Until the reservation is completed, released or abandoned below, a decision that
            // unwinds (a panicking response body) or is dropped abandons it.
            let mut unsettled = Unsettled {
                store: &store,
                key: &key,
                reservation: &reservation,
                armed: true,
            };
            if let Some(input) = &mut input {
                store.attach(key.as_str(), &reservation, &mut input.parts.extensions);
            }
            // Admission, the create and its response read whole, under one lease renewed as
            // they go; a release, when one is due, after the renewals stopped.
            let work = async {
                let admitted = match &input {
                    Some(input) => admit(&admission, &input.value).await,
                    None => Err(Rejection::CreateFailed),
                };
                let permit = match admitted {
                    Ok(permit) => permit,
                    // Only a confirmed refusal releases the key.
                    Err(rejection) => {
                        // Let go of the inner service and the request before the store's
                        // round trip: the service may hold a slot of its own.
                        drop(input.take());
                        let then = match rejection {
                            Rejection::NotAdmitted(_) => Then::Release,
                            _ => Then::Abandon,
                        };
                        return Err((settings.refuse(rejection), then));
                    }
                };
                let Some(input) = input.take() else {
                    return Err((settings.refuse(Rejection::CreateFailed), Then::Abandon));
                };
                let response = match keep(
                    create(input, settings.value_extension).await,
                    settings.config.stored,
                ) {
                    Keep::Store(response) => response,
                    Keep::Release(response) => return Err((response, Then::Release)),
                    Keep::Pending(rejection) => {
                        return Err((settings.refuse(rejection), Then::Abandon));
                    }
                };
                match collect(response, &settings).await {
                    Ok(collected) => Ok((collected, permit)),
                    Err(rejection) => Err((settings.refuse(rejection), Then::Abandon)),
                }
            };
            let lease = settings.config.lease.duration();
            let (key, metrics) = (key.as_str(), &settings.config.metrics);
            let created = renewing(work, &store, key, &reservation, lease, metrics).await;
            unsettled.armed = false;
            let response = finish(created, &store, key, &reservation, &settings).await;
            // Counted by the layer's drain, if any, until the decision ends (an early return,
            // or the decision dropped, lets go of it too).
            drop(in_flight);
            response
        }
    }
}

/// Step 8, or what follows a create that ended without a response to store: complete and
/// reply, or settle the reservation (release or abandon it) and reply. One await either way,
/// with the create's answer held in one place while it runs.
#[allow(clippy::manual_async_fn)] // an `async fn` would hold `created` twice (see the module)
fn finish<'a, St: Store, O: Operation, P: 'a, B: 'a>(
    created: Created<P, B>,
    store: &'a St,
    key: &'a str,
    reservation: &'a Reservation,
    settings: &'a Settings<O>,
) -> impl Future<Output = Response<ResponseBody<B>>> + 'a {
    async move {
        let outcome = match &created {
            Ok((collected, _)) => {
                let stored = match collected {
                    Collected::Whole(stored) => stored,
                    Collected::Over(over) => &over.0,
                };
                complete(&settings.settling, store, key, reservation, stored).await
            }
            Err((_, then)) => {
                match then {
                    Then::Release => release(&settings.settling, store, key, reservation).await,
                    Then::Abandon => store.abandon(key, reservation).await,
                }
                // Not read: the unstored answer carries its own outcome.
                Outcome::Unstored
            }
        };
        match created {
            Ok((collected, permit)) => {
                drop(permit);
                match (outcome, collected) {
                    // The create's writes may not have committed: its response is not the
                    // answer.
                    (Outcome::StoreUnavailable, _) => settings.refuse(Rejection::StoreUnavailable),
                    (outcome, Collected::Whole(stored)) => reply::stored(stored, outcome),
                    // Over the cap: the response itself, whole, its record the compact one.
                    (outcome, Collected::Over(over)) => {
                        over.1.map(|body| body.with_outcome(outcome))
                    }
                }
            }
            Err((response, _)) => response,
        }
    }
}

/// What the create ended with: the response read (to store, and for one over the cap, to
/// give whole) and the admission's permit; or the response to give unstored and what to do
/// with the reservation.
type Created<P, B> = Result<(Collected<B>, P), (Response<ResponseBody<B>>, Then)>;

/// What the create takes: the inner service and the request, taken from the decision when
/// the create starts.
struct CreateInput<S, T> {
    inner: S,
    parts: Parts,
    body: Bytes,
    value: T,
}

/// Where the decision's claim starts, with the reservation it was made with.
#[derive(Clone, Copy)]
pub(crate) enum First {
    /// From the start: the store answers only by waiting.
    Claim,
    /// Claimed already, new.
    New,
    /// Claimed already and pending: wait for the first attempt.
    Wait,
}

/// Step 4: the claim decides; only a new claim goes on, with its reservation.
/// The reservation is chosen before the claim: if the claim's answer is lost, the claim may
/// still take effect, and releasing the reservation settles it.
async fn claim<St: Store, O: Operation, B>(
    store: &St,
    key: &str,
    fingerprint: &Fingerprint,
    reservation: Reservation,
    settings: &Settings<O>,
    first: First,
) -> Result<Reservation, Response<ResponseBody<B>>> {
    let mut answer = match first {
        First::New => return Ok(reservation),
        First::Wait => Ok(Claim::Pending),
        First::Claim => {
            let started = Started::now();
            let answer = store
                .claim_with(key, fingerprint, reservation, settings.config.lease)
                .await;
            settings.config.metrics.store_call(Call::Claim, started);
            answer
        }
    };
    if let (Ok(Claim::Pending), Some(wait)) = (&answer, settings.config.pending_wait) {
        // Boxed: the wait is rare and its future large, and every decision's state would
        // otherwise hold room for it.
        answer = Box::pin(wait_for_first(
            store,
            key,
            fingerprint,
            reservation,
            settings,
            wait,
        ))
        .await;
    }
    answered(answer, store, key, fingerprint, reservation, settings)
}

/// The claim's answer: a new claim's reservation, or the reply. A failure whose outcome is
/// unknown is settled in a task of its own.
// As `Validated::claim_now`: the reply moves once.
#[allow(clippy::result_large_err)]
fn answered<St: Store, O: Operation, B>(
    answer: Result<Claim, StoreError>,
    store: &St,
    key: &str,
    fingerprint: &Fingerprint,
    reservation: Reservation,
    settings: &Settings<O>,
) -> Result<Reservation, Response<ResponseBody<B>>> {
    let rejection = match answer {
        Ok(Claim::New(reservation)) => return Ok(reservation),
        Ok(Claim::Replay(stored)) => {
            let mut response = reply::stored(stored, Outcome::Replay);
            if settings.config.mark_replays {
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            }
            return Err(response);
        }
        Ok(Claim::Pending) => Rejection::Pending,
        Ok(Claim::Conflict) => Rejection::Conflict,
        Err(error) => {
            tracing::warn!(
                error = &error as &dyn std::error::Error,
                "claim failed; nothing created"
            );
            if is_unknown(&error) {
                settle(
                    &settings.settling,
                    store.clone(),
                    key.to_owned(),
                    reservation,
                    Settle::Claim(*fingerprint),
                );
            }
            Rejection::StoreUnavailable
        }
    };
    Err(settings.refuse(rejection))
}

/// Step 5: admission. The caller releases the key on a refusal. A panic is
/// caught: no refusal was confirmed, so the key stays pending and the client gets a 500.
async fn admit<T, A: Admission<T>>(admission: &A, value: &T) -> Result<A::Permit, Rejection> {
    match CatchUnwind::new(|| admission.admit(value)).await {
        Some(Admit::Proceed(permit)) => Ok(permit),
        Some(Admit::Refuse(refusal)) => Err(Rejection::NotAdmitted(refusal)),
        None => {
            tracing::error!("admission panicked; the key stays pending");
            Err(Rejection::CreateFailed)
        }
    }
}

/// Step 6: the create. The inner service gets the body bytes and the
/// operation's value in the extensions (if `with_value`). A panic in its `call` or its future
/// is caught once and is a failed create (`None`): the create may have run.
fn create<S, ReqBody, ResBody, T>(
    input: CreateInput<S, T>,
    with_value: bool,
) -> CatchUnwind<S::Future>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    T: Clone + Send + Sync + 'static,
{
    let CreateInput {
        mut inner,
        parts,
        body,
        value,
    } = input;
    let mut request = Request::from_parts(parts, RequestBody::full(body));
    if with_value {
        request.extensions_mut().insert(value);
    }
    CatchUnwind::new(move || inner.call(request))
}

/// What follows a create that ends without a stored response.
enum Then {
    /// Release the key: nothing was created (a confirmed admission refusal, or a create that
    /// answered so).
    Release,
    /// Leave the key to the store ([`Store::abandon`]): the create may have taken effect.
    Abandon,
}

/// Step 8: the complete, before the reply is written. If its answer is lost,
/// it is repeated later with the same reservation, so the key ends completed, not pending.
/// A transaction that did not commit ([`StoreErrorKind::Uncommitted`]) is
/// [`Outcome::StoreUnavailable`]: the create's writes went with it, or may have.
async fn complete<St: Store>(
    settling: &Tally,
    store: &St,
    key: &str,
    reservation: &Reservation,
    stored: &StoredResponse,
) -> Outcome {
    let started = Started::now();
    let completed = store.complete(key, reservation, stored).await;
    settling.metrics().store_call(Call::Complete, started);
    match completed {
        Ok(()) => Outcome::Created,
        Err(error) if error.kind() == StoreErrorKind::Uncommitted => {
            tracing::error!(
                error = &error as &dyn std::error::Error,
                "the create's transaction did not commit"
            );
            Outcome::StoreUnavailable
        }
        Err(error) => {
            tracing::error!(
                error = &error as &dyn std::error::Error,
                "complete failed after the create"
            );
            if is_unknown(&error) {
                settle(
                    settling,
                    store.clone(),
                    key.to_owned(),
                    *reservation,
                    Settle::Complete(stored.clone()),
                );
            }
            Outcome::CompleteFailed
        }
    }
}
