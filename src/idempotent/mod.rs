//! Idempotent work beyond HTTP: any async function, job or message consumer, run at most once
//! per key on the same stores, with the layer's semantics.
//!
//! [`Idempotent::run`] claims the key with a fingerprint of the operation, runs the work under
//! a lease renewed while it runs, stores its value and answers it; a later run with the key
//! gets the stored value without running the work ([`Ran::Replayed`]). Another fingerprint
//! under the key is a [conflict](RunError::Conflict); a key another attempt holds is
//! [pending](RunError::Pending), or waited for ([`pending_wait`](Idempotent::pending_wait)).
//! A store that does not answer runs nothing ([`RunError::StoreUnavailable`]), and a lost
//! answer is settled in the background, as the layer settles it. The layer's services and
//! this API run one implementation of the decision.
//!
//! On a transactional store (`TransactionalPostgresStore`, `TransactionalMySqlStore`) the work
//! is exactly once: it takes the claim's transaction from its [`Attempt`]
//! (`attempt.get::<PgTransaction>()`), its writes commit with the stored value or not at all;
//! drop the transaction's connection before the work returns, as the store commits on it.
//! A commit whose answer was lost is [`RunError::Unknown`]: the writes may have committed, and
//! the next run with the key tells which (a replay, or a run).
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use tower_idempotency::idempotent::{self, Idempotent, Ran};
//! use tower_idempotency::MemoryStore;
//!
//! #[derive(serde::Serialize)]
//! struct Message<'a> {
//!     id: &'a str,
//!     parcel_id: &'a str,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let labels = Idempotent::new(MemoryStore::new()).scope("labels");
//! let message = Message { id: "msg-1", parcel_id: "parcel-42" };
//! let fingerprint = idempotent::fingerprint(&message)?;
//!
//! let printed = AtomicUsize::new(0);
//! let print = || async {
//!     printed.fetch_add(1, Ordering::SeqCst);
//!     Ok::<_, std::io::Error>(format!("label for {}", message.parcel_id))
//! };
//! let first = labels.run(message.id, fingerprint, |_attempt| print()).await?;
//! assert_eq!(first, Ran::Done("label for parcel-42".to_owned()));
//!
//! // Delivered again: the stored value, the work not run.
//! let again = labels.run(message.id, fingerprint, |_attempt| print()).await?;
//! assert_eq!(again, Ran::Replayed("label for parcel-42".to_owned()));
//! assert_eq!(printed.load(Ordering::SeqCst), 1);
//! # Ok(()) }
//! ```
//!
//! # At most once, exactly once, and the acknowledgement
//!
//! A consumer acknowledges a message after [`run`](Idempotent::run) answers a value (done or
//! replayed): by then the value is stored. A crash between the two leaves the message
//! unacknowledged; the broker delivers it again, and the run replays the stored value without
//! running the work. A crash during the work leaves the key pending until its lease lapses;
//! with [`take_over_abandoned`](Idempotent::take_over_abandoned), a later delivery runs it
//! again. So on a plain store the work's effect happens at most once, and once more only
//! after a crash in the middle of the work; on a transactional store, whose effect commits
//! with the stored value, exactly once.
//!
//! The key is the message's own id, the one its producer set (a body member, or a header the
//! producer writes), never the broker's delivery id, which changes with each redelivery.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

mod outcome;
#[cfg(test)]
mod tests;

pub use self::outcome::{Failures, Ran, RunError};
use crate::config::{DEFAULT_MAX_WAITING, MAX_SETTLING};
use crate::config::{Options, Rules};
use crate::metrics::Metrics;
use crate::operation::Fingerprint;
use crate::operation::is_key;
use crate::operation::jcs;
use crate::pipeline::{
    Answered, CatchUnwind, Completed, Decided, Host, Then, Work, claim_now, decide,
};
use crate::reply::Outcome;
use crate::scope::KeyBuf;
use crate::store::{Lease, Reservation, Store, StoredResponse};
use crate::tally::{Bounded, Tally};

/// Runs async work at most once per key (exactly once on a transactional store); see the
/// [module](self). Cloning it is cheap; clones share their bounds.
#[derive(Debug, Clone)]
pub struct Idempotent<St> {
    store: St,
    scope: Arc<str>,
    rules: Arc<Rules>,
    failures: Failures,
}

impl<St: Store> Idempotent<St> {
    /// Runs work on `store`, in the empty scope, with the layer's defaults: a 30-second lease
    /// that is not taken over, no wait for a pending key, [`Failures::Keep`].
    pub fn new(store: St) -> Self {
        let metrics = Metrics::default();
        let rules = Rules {
            options: Options::default(),
            waiting: Tally::new(&Arc::new(Bounded::waiting(DEFAULT_MAX_WAITING)), &metrics),
            settling: Tally::new(&Arc::new(Bounded::settling(MAX_SETTLING)), &metrics),
            metrics,
            drain: None,
            watch_client: false,
        };
        Self {
            store,
            scope: Arc::from(""),
            rules: Arc::new(rules),
            failures: Failures::default(),
        }
    }

    /// The scope of the keys: the same key in two scopes is two operations. Name it after the
    /// work (`"labels"`, `"send-invoice"`). Nothing requires one (the layer does, since its
    /// keys come from clients; a run's come from your producers), but two kinds of work on one
    /// store, or two tenants' messages, each need their own.
    ///
    /// ```
    /// use tower_idempotency::idempotent::Idempotent;
    /// use tower_idempotency::MemoryStore;
    ///
    /// let invoices = Idempotent::new(MemoryStore::new()).scope("send-invoice");
    /// assert_eq!(invoices.store_key("msg-1"), "run:12:send-invoicemsg-1");
    /// ```
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Arc::from(scope.into());
        self
    }

    /// How long a run holds its key without a renewal (renewed while the work runs, every third
    /// of it); at least [`Lease::MIN_DURATION`]. The default is 30 seconds.
    pub fn lease(mut self, lease: Duration) -> Self {
        let rules = Arc::make_mut(&mut self.rules);
        let take_over = rules.options.lease.takes_over();
        rules.options.lease = Lease::new(lease);
        if take_over {
            rules.options.lease = rules.options.lease.take_over_abandoned();
        }
        self
    }

    /// Lets a run take over a key whose holder stopped renewing its lease (a crashed worker):
    /// the work runs again. A key is taken over only if the run that claimed it took over too,
    /// so give every worker of a scope this setting. Without it, such a key answers
    /// [`RunError::Pending`] until an operator resolves it.
    pub fn take_over_abandoned(mut self) -> Self {
        let rules = Arc::make_mut(&mut self.rules);
        rules.options.lease = rules.options.lease.take_over_abandoned();
        self
    }

    /// Waits up to `wait` for another attempt that holds the key, and answers its stored value
    /// (or runs the work, if that attempt released the key), instead of
    /// [`RunError::Pending`] at once. The wait wakes when the store says the key changed (a
    /// notification where the store has one, else a poll every 50 milliseconds).
    /// `Duration::ZERO` answers pending at once, as without the setting. At most 1,000 runs of
    /// this value and its clones wait at once; more answer pending at once.
    pub fn pending_wait(mut self, wait: Duration) -> Self {
        Arc::make_mut(&mut self.rules).options.pending_wait = Some(wait);
        self
    }

    /// What a run whose work failed does with its key; [`Failures::Keep`] by default.
    pub fn on_failure(mut self, failures: Failures) -> Self {
        self.failures = failures;
        self
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }

    /// The key in the store of a run with `key` in this scope: unambiguous, and never the key
    /// of a request the layer guards. For the operator's view of a record.
    pub fn store_key(&self, key: &str) -> String {
        run_key(&self.scope, key)
    }

    /// Runs `work` unless a run with `key` completed or holds it: its value
    /// ([`Ran::Done`]), stored with the key (or [`Ran::Unrecorded`], if the store failed to
    /// keep it); or the stored value of the run that completed it ([`Ran::Replayed`]); or why
    /// there is none ([`RunError`]).
    ///
    /// Dropping the run's future (a timeout around it) is a crash in miniature: the work
    /// stops where it was; a store call in flight is settled in the background (a claim
    /// released, a complete repeated), and a key whose work was under way stays pending until
    /// its lease lapses, then is taken over if the runs [take over](Self::take_over_abandoned).
    ///
    /// `fingerprint` is what two runs with one key must share to be the same operation
    /// ([`fingerprint`] of the message, say; a [`Fingerprint`] is `Copy`). The value is stored
    /// as JSON (`serde_json`). The work gets the claim's [`Attempt`]: on a transactional store,
    /// its transaction. The work may borrow (it need not be `'static`), and the run's future is
    /// `Send` when the work's is, so it can be spawned.
    ///
    /// # Errors
    ///
    /// See [`RunError`]; [`is_transient`](RunError::is_transient) tells those worth a retry
    /// with the same key.
    pub async fn run<T, E, F, Fut>(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Ran<T>, RunError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        if !is_key(key.as_bytes()) {
            return Err(RunError::InvalidKey);
        }
        let held = Held {
            store: &self.store,
            key: KeyBuf::Heap(run_key(&self.scope, key)),
            fingerprint,
            rules: &self.rules,
        };
        let call = Call {
            work: Some(work),
            failures: self.failures,
            _value: PhantomData,
        };
        let (first, reservation) = match claim_now(
            held.store,
            held.key.as_str(),
            &held.fingerprint,
            Reservation::generate(),
            held.rules,
        ) {
            Ok(start) => start,
            Err(answer) => return call.answer(&held, Decided::Answered(answer)),
        };
        decide(held, call, first, reservation).await
    }
}

/// What the work of a new claim gets: what the store attached to the claim, such as a
/// transactional store's transaction.
#[derive(Debug)]
pub struct Attempt {
    extensions: http::Extensions,
}

impl Attempt {
    /// What the store attached of type `T`: `PgTransaction` on `TransactionalPostgresStore`,
    /// `MySqlTransaction` on `TransactionalMySqlStore`; `None` on a plain store.
    ///
    /// ```
    /// # async fn work(attempt: tower_idempotency::idempotent::Attempt) {
    /// # #[cfg(feature = "postgres")]
    /// if let Some(transaction) = attempt.get::<tower_idempotency::store::PgTransaction>() {
    ///     let connection = transaction.acquire().await;
    ///     // … the work's writes, committed with the stored value
    /// #   drop(connection);
    /// }
    /// # }
    /// ```
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.extensions.get()
    }

    /// Everything the store attached.
    pub fn extensions(&self) -> &http::Extensions {
        &self.extensions
    }
}

/// The fingerprint of `value`: SHA-256 over its canonical JSON (RFC 8785, as
/// [`JsonOperation`](crate::JsonOperation) fingerprints a body), so that two values equal as
/// JSON share it whatever their member order.
///
/// ```
/// use std::collections::BTreeMap;
/// use tower_idempotency::idempotent::fingerprint;
///
/// #[derive(serde::Serialize)]
/// struct Message { id: String, amount: u64 }
///
/// let a = fingerprint(&Message { id: "m-1".into(), amount: 1250 }).unwrap();
/// let b = fingerprint(&serde_json::json!({ "amount": 1250, "id": "m-1" })).unwrap();
/// assert_eq!(a, b);
/// assert_ne!(a, fingerprint(&serde_json::json!({ "amount": 1251, "id": "m-1" })).unwrap());
/// ```
///
/// # Errors
///
/// A `serde_json::Error` for a value serde cannot write as JSON (a map with keys that are not
/// strings), or whose JSON has no canonical form (nested deeper than 128).
pub fn fingerprint<T: Serialize + ?Sized>(value: &T) -> Result<Fingerprint, serde_json::Error> {
    let json = serde_json::to_vec(value)?;
    let canonical =
        jcs::canonicalize(&json).map_err(<serde_json::Error as serde::ser::Error>::custom)?;
    Ok(Fingerprint::from_sha256(Sha256::digest(&canonical).into()))
}

/// The store key of `key` run in `scope`: `run:` (which no request's key begins with: a
/// method is a token, a scope's length a number), the scope's byte length, the scope, the key.
fn run_key(scope: &str, key: &str) -> String {
    format!("run:{}:{scope}{key}", scope.len())
}

/// What a run's decision holds, lent by the [`Idempotent`] it runs on.
struct Held<'s, St> {
    store: &'s St,
    key: KeyBuf,
    fingerprint: Fingerprint,
    rules: &'s Rules,
}

impl<St: Store> Host for Held<'_, St> {
    type Store = St;

    fn store(&self) -> &St {
        self.store
    }

    fn key(&self) -> &KeyBuf {
        &self.key
    }

    fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    fn rules(&self) -> &Rules {
        self.rules
    }
}

/// The work of a run, until it is called.
struct Call<F, T, E> {
    work: Option<F>,
    failures: Failures,
    _value: PhantomData<fn() -> (T, E)>,
}

/// A value computed now, and the record it is stored as.
struct Value<T>(StoredResponse, T);

impl<T> Completed for Value<T> {
    fn stored(&self) -> &StoredResponse {
        &self.0
    }
}

impl<St, F, Fut, T, E> Work<Held<'_, St>> for Call<F, T, E>
where
    St: Store,
    F: FnOnce(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
{
    type Done = Value<T>;
    type Unstored = RunError<E>;
    type Output = Result<Ran<T>, RunError<E>>;

    fn run<'a>(
        &'a mut self,
        host: &'a Held<'_, St>,
        reservation: Reservation,
    ) -> impl Future<Output = Result<Value<T>, (RunError<E>, Then)>> + 'a {
        let mut attempt = Attempt {
            extensions: http::Extensions::new(),
        };
        host.store
            .attach(host.key.as_str(), &reservation, &mut attempt.extensions);
        let work = self.work.take();
        let failed = match self.failures {
            Failures::Keep => || Then::Abandon,
            Failures::Release => || Then::Release,
        };
        async move {
            let Some(work) = work else {
                return Err((RunError::Panicked, Then::Abandon));
            };
            match CatchUnwind::new(|| work(attempt)).await {
                Some(Ok(value)) => match serde_json::to_vec(&value) {
                    Ok(json) => {
                        let stored = StoredResponse::new(
                            StatusCode::OK,
                            HeaderMap::new(),
                            Bytes::from(json),
                        );
                        Ok(Value(stored, value))
                    }
                    // The work ran: its key stays taken.
                    Err(error) => Err((RunError::Unstorable(error), Then::Abandon)),
                },
                Some(Err(error)) => Err((RunError::Failed(error), failed())),
                None => {
                    tracing::error!("the work panicked");
                    Err((RunError::Panicked, failed()))
                }
            }
        }
    }

    fn answer(self, _: &Held<'_, St>, decided: Decided<Value<T>, RunError<E>>) -> Self::Output {
        match decided {
            Decided::Answered(Answered::Replay(stored)) => serde_json::from_slice(stored.body())
                .map(Ran::Replayed)
                .map_err(RunError::Undecodable),
            Decided::Answered(Answered::Pending) => Err(RunError::Pending),
            Decided::Answered(Answered::Conflict) => Err(RunError::Conflict),
            Decided::Answered(Answered::Expired(tombstone)) => Err(RunError::Expired(tombstone)),
            Decided::Answered(Answered::StoreUnavailable) => Err(RunError::StoreUnavailable),
            // A transaction that did not commit: the work's writes went with it.
            Decided::Done(_, Outcome::StoreUnavailable) => Err(RunError::StoreUnavailable),
            Decided::Done(_, Outcome::Unknown) => Err(RunError::Unknown),
            Decided::Done(Value(_, value), Outcome::Created) => Ok(Ran::Done(value)),
            // The work ran; its complete failed (settled in the background if its outcome is
            // unknown).
            Decided::Done(Value(_, value), _) => Ok(Ran::Unrecorded(value)),
            Decided::Unstored(error) => Err(error),
        }
    }
}
