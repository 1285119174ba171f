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
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::Service;

mod decision;
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

pub(crate) use self::decision::{
    Answered, Completed, Decided, First, Host, Then, Work, claim_now, decide,
};
pub(crate) use self::futures::CatchUnwind;
use self::response::{Collected, Keep, collect, keep};
pub(crate) use self::wait::CLIENT_LEFT;
use crate::admission::{Admission, Admit};
use crate::body::{self, Collector, ReadError, RequestBody, ResponseBody};
use crate::config::Rules;
use crate::config::{OtherPaths, Settings, StoredResponses};
use crate::drain::InFlight;
use crate::headers;
use crate::operation::{Fingerprint, Head, IdempotencyKey, Operation, Parsed, is_key};
use crate::reply::{self, IDEMPOTENT_REPLAYED, Outcome, Rejection};
use crate::scope::KeyBuf;
use crate::store::{Reservation, Store, StoredResponse};

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
            Ok(((key, client_key), fingerprint, value, body)) => Ok(Validated {
                pipeline: self,
                key,
                client_key,
                fingerprint,
                value,
                parts,
                body,
            }),
            Err(rejection) => Err(self.settings.refuse(rejection)),
        }
    }

    /// Step 3: the operation's key (within the scope, the method and the path, and the length
    /// of the client's key at its end), fingerprint and value.
    fn operation(
        &self,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<(StoreKey, Fingerprint, O::Value), Rejection> {
        let Parsed {
            key,
            fingerprint,
            value,
        } = self.settings.operation.parse(parts, body)?;
        let scope = match &self.settings.config.scope {
            Some(scope) => Some((scope.0)(parts).ok_or(Rejection::ScopeRequired)?),
            None => None,
        };
        let client_key = key.len();
        let key = KeyBuf::new(scope.as_deref(), &parts.method, parts.uri.path(), &key);
        Ok(((key, client_key), fingerprint, value))
    }
}

/// A request's store key, and the length of the client's key at its end.
type StoreKey = (KeyBuf, usize);

/// A valid request about to be claimed.
pub(crate) struct Validated<S, St, O: Operation, A> {
    pipeline: Pipeline<S, St, O, A>,
    key: KeyBuf,
    /// The length of the client's key, the end of `key`: read from there for the create,
    /// rather than held twice.
    client_key: usize,
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
        let in_flight = match &settings.rules.drain {
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
        match decision::claim_now(
            store,
            key,
            fingerprint,
            Reservation::generate(),
            &settings.rules,
        ) {
            Ok((first, reservation)) => Ok((first, reservation, in_flight)),
            Err(answer) => Err(answered(answer, settings)),
        }
    }

    /// Steps 4 (unless the claim was made at once) to 8, [`decide`]: claim, admit, create,
    /// complete, and only then reply.
    ///
    /// The request's pieces are the decision's own, each held once (see the module), and what
    /// the create takes is taken from its place when the create starts.
    pub(crate) fn run<ReqBody, ResBody>(
        self,
        first: First,
        reservation: Reservation,
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
            client_key,
            fingerprint,
            value,
            parts,
            body,
        } = self;
        let host = Held {
            store,
            key,
            fingerprint,
            settings,
        };
        let work = CreateWork {
            input: Some(CreateInput {
                inner,
                parts,
                body,
                value,
                client_key,
            }),
            admission,
            in_flight,
            _types: PhantomData,
        };
        decide(host, work, first, reservation)
    }
}

/// What a request's decision holds for its whole life.
struct Held<St, O> {
    store: St,
    /// Read where it is (`key.as_str()` at each use): a `&str` held across the awaits would
    /// take a fat pointer's room in every state of the decision.
    key: KeyBuf,
    fingerprint: Fingerprint,
    settings: Arc<Settings<O>>,
}

impl<St: Store, O> Host for Held<St, O> {
    type Store = St;

    fn store(&self) -> &St {
        &self.store
    }

    fn key(&self) -> &KeyBuf {
        &self.key
    }

    fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    fn rules(&self) -> &Rules {
        &self.settings.rules
    }
}

/// A request's work: admission, the create, its response read whole.
struct CreateWork<S, T, A, ReqBody, ResBody> {
    /// Taken from its place when the create starts.
    input: Option<CreateInput<S, T>>,
    admission: A,
    /// Counted by the layer's drain, if any, until the decision ends (dropped with it, too).
    in_flight: Option<InFlight>,
    _types: PhantomData<fn(ReqBody) -> ResBody>,
}

impl<S, St, O, A, ReqBody, ResBody> Work<Held<St, O>>
    for CreateWork<S, O::Value, A, ReqBody, ResBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    St: Store,
    O: Operation,
    A: Admission<O::Value>,
    ResBody: Body<Data = Bytes>,
{
    type Done = Done<ResBody, A::Permit>;
    type Unstored = Response<ResponseBody<ResBody>>;
    type Output = Response<ResponseBody<ResBody>>;

    fn run<'a>(
        &'a mut self,
        host: &'a Held<St, O>,
        reservation: Reservation,
    ) -> impl Future<Output = Result<Self::Done, (Self::Unstored, Then)>> + 'a {
        let Held {
            store,
            key,
            settings,
            ..
        } = host;
        if let Some(input) = &mut self.input {
            store.attach(key.as_str(), &reservation, &mut input.parts.extensions);
            let client_key = key.as_str().len().checked_sub(input.client_key);
            // Only a valid key: a custom operation's may be anything.
            let client_key = client_key.and_then(|at| key.as_str().get(at..));
            if let Some(client_key) = client_key.filter(|key| is_key(key.as_bytes())) {
                input
                    .parts
                    .extensions
                    .insert(IdempotencyKey(client_key.to_owned()));
            }
        }
        async move {
            // A retry past the window that would create (the store kept nothing of its key;
            // one that kept a record replayed it before this): the key is released, nothing
            // created.
            if let Some(input) = &self.input
                && settings.past_window(&input.parts.headers)
            {
                drop(self.input.take());
                return Err((settings.refuse(Rejection::KeyExpired(None)), Then::Release));
            }
            let admitted = match &self.input {
                Some(input) => admit(&self.admission, &input.value).await,
                None => Err(Rejection::CreateFailed),
            };
            let permit = match admitted {
                Ok(permit) => permit,
                // Only a confirmed refusal releases the key.
                Err(rejection) => {
                    // Let go of the inner service and the request before the store's round
                    // trip: the service may hold a slot of its own.
                    drop(self.input.take());
                    let then = match rejection {
                        Rejection::NotAdmitted(_) => Then::Release,
                        _ => Then::Abandon,
                    };
                    return Err((settings.refuse(rejection), then));
                }
            };
            let Some(input) = self.input.take() else {
                return Err((settings.refuse(Rejection::CreateFailed), Then::Abandon));
            };
            let stored = settings
                .config
                .stored
                .unwrap_or_else(|| StoredResponses::default_for(store));
            let response = match keep(create(input, settings.value_extension).await, stored) {
                Keep::Store(response) => response,
                Keep::Release(response) => return Err((response, Then::Release)),
                Keep::Pending(rejection) => {
                    return Err((settings.refuse(rejection), Then::Abandon));
                }
            };
            match collect(response, settings).await {
                Ok(collected) => Ok(Done(collected, permit)),
                Err(rejection) => Err((settings.refuse(rejection), Then::Abandon)),
            }
        }
    }

    fn answer(
        self,
        host: &Held<St, O>,
        decided: Decided<Self::Done, Self::Unstored>,
    ) -> Self::Output {
        // The decision ends: the drain stops counting it before the reply is written.
        drop(self.in_flight);
        respond(decided, &host.settings)
    }
}

/// A create's response read (to store, and for one over the cap, to give whole) and the
/// admission's permit, held until the reply.
struct Done<B, P>(Collected<B>, P);

impl<B, P> Completed for Done<B, P> {
    fn stored(&self) -> &StoredResponse {
        match &self.0 {
            Collected::Whole(stored) => stored,
            Collected::Over(over) => &over.0,
        }
    }
}

/// The reply to a decision: the stored response (the create's, or a replay), or the refusal.
fn respond<O: Operation, P, B>(
    decided: Decided<Done<B, P>, Response<ResponseBody<B>>>,
    settings: &Settings<O>,
) -> Response<ResponseBody<B>> {
    let mut response = match decided {
        Decided::Answered(answer) => return answered(answer, settings),
        Decided::Done(Done(collected, permit), outcome) => {
            drop(permit);
            match (outcome, collected) {
                // The create's writes may not have committed: its response is not the answer.
                (Outcome::StoreUnavailable, _) => settings.refuse(Rejection::StoreUnavailable),
                // They may have: neither the response nor a refusal that says nothing was.
                (Outcome::Unknown, _) => settings.refuse(Rejection::OutcomeUnknown),
                // Nothing committed, and the response's body held what the commit needed.
                (Outcome::CreateFailed, _) => settings.refuse(Rejection::CreateFailed),
                (outcome, Collected::Whole(stored)) => reply::stored(stored, outcome),
                // Over the cap: the response itself, whole, its record the compact one.
                (outcome, Collected::Over(over)) => over.1.map(|body| body.with_outcome(outcome)),
            }
        }
        Decided::Unstored(response) => response,
    };
    settings.advertise(&mut response);
    response
}

/// The reply to a claim that was not new: the replay, or the refusal.
fn answered<O: Operation, B>(
    answer: Answered,
    settings: &Settings<O>,
) -> Response<ResponseBody<B>> {
    let rejection = match answer {
        Answered::Replay(stored) => {
            let mut response = reply::stored(stored, Outcome::Replay);
            if settings.config.mark_replays {
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            }
            settings.advertise(&mut response);
            return response;
        }
        Answered::Pending => Rejection::Pending,
        Answered::Conflict => Rejection::Conflict,
        Answered::Expired(tombstone) => Rejection::KeyExpired(Some(tombstone)),
        Answered::StoreUnavailable => Rejection::StoreUnavailable,
    };
    settings.refuse(rejection)
}

/// What the create takes: the inner service and the request, taken from the decision when
/// the create starts.
struct CreateInput<S, T> {
    inner: S,
    parts: Parts,
    body: Bytes,
    value: T,
    /// The length of the client's key at the end of the store key.
    client_key: usize,
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
        ..
    } = input;
    let mut request = Request::from_parts(parts, RequestBody::full(body));
    if with_value {
        request.extensions_mut().insert(value);
    }
    CatchUnwind::new(move || inner.call(request))
}
