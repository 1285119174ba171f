//! Admission: may a newly claimed operation start its create?
//!
//! Admission is asked only after a claim returned *new*, so the key is already reserved. A
//! refusal is confirmed before any business work, so the layer releases the reservation and
//! answers with the refusal's status, `Retry-After: 2` and the operation's *not admitted*
//! body (a `not_admitted` problem for the generic operations); a later request with the key is
//! new again.
//!
//! ```
//! use tower_idempotency::admission::{admit_fn, Admit, ConcurrencyLimit, RateLimit, Refusal};
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//! use tower_idempotency::operation::LabelContract;
//! use tower_idempotency::operation::LabelOperation;
//!
//! // At most 8 creates at once (503 beyond), at most 100 admitted creates per second (429).
//! let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys().admission(ConcurrencyLimit::new(8));
//! let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys().admission(RateLimit::per_second(100));
//!
//! // Any policy of your own.
//! let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys().admission(admit_fn(|op: &LabelOperation| {
//!     let busy = op.parcel_id.starts_with("blocked-");
//!     async move { if busy { Admit::Refuse(Refusal::TooManyRequests) } else { Admit::Proceed(()) } }
//! }));
//! # drop(layer);
//! ```

use std::future::{Future, ready};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use http::StatusCode;

/// A policy that admits or refuses a newly claimed operation of type `T` (the
/// [`Operation::Value`](https://docs.rs/tower-idempotency/latest/tower_idempotency/operation/trait.Operation.html#associatedtype.Value): the label contract's `LabelOperation`,
/// your own body type, …).
///
/// The built-in policies admit operations of every type.
pub trait Admission<T>: Clone + Send + Sync + 'static {
    /// Held from admission until the create and the complete are done, then dropped.
    type Permit: Send + 'static;

    /// Decides for `operation`, whose key is already reserved.
    fn admit(&self, operation: &T) -> impl Future<Output = Admit<Self::Permit>> + Send;
}

/// The answer of an [`Admission`].
#[derive(Debug)]
pub enum Admit<P = ()> {
    /// Go on with the create, holding the permit until it is completed.
    Proceed(P),
    /// A confirmed refusal before any business work: release the key and reply.
    Refuse(Refusal),
}

/// Admits every operation. The default.
///
/// ```
/// use tower_idempotency::admission::AlwaysAdmit;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency::operation::LabelContract;
///
/// let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract).global_keys().admission(AlwaysAdmit);
/// # drop(layer);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysAdmit;

impl<T> Admission<T> for AlwaysAdmit {
    type Permit = ();

    fn admit(&self, _: &T) -> impl Future<Output = Admit> + Send {
        ready(Admit::Proceed(()))
    }
}

/// An [`Admission`] of operations of type `T` from a closure; build it with [`admit_fn`].
pub struct AdmitFn<F, T> {
    f: F,
    operation: PhantomData<fn(&T)>,
}

impl<F: Clone, T> Clone for AdmitFn<F, T> {
    fn clone(&self) -> Self {
        Self {
            f: self.f.clone(),
            operation: PhantomData,
        }
    }
}

impl<F, T> std::fmt::Debug for AdmitFn<F, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmitFn").finish_non_exhaustive()
    }
}

/// Turns a closure returning a future of [`Admit`] into an [`Admission`].
///
/// ```
/// use tower_idempotency::admission::{admit_fn, Admit, Refusal};
///
/// let closed = admit_fn(|_op: &serde_json::Value| async { Admit::<()>::Refuse(Refusal::ServiceUnavailable) });
/// # drop(closed);
/// ```
pub fn admit_fn<T, F, Fut>(f: F) -> AdmitFn<F, T>
where
    F: Fn(&T) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Admit> + Send,
{
    AdmitFn {
        f,
        operation: PhantomData,
    }
}

impl<T: 'static, F, Fut> Admission<T> for AdmitFn<F, T>
where
    F: Fn(&T) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Admit> + Send,
{
    type Permit = ();

    fn admit(&self, operation: &T) -> impl Future<Output = Admit> + Send {
        (self.f)(operation)
    }
}

/// At most `n` creates at once; beyond that, `503` ([`Refusal::ServiceUnavailable`]).
///
/// A slot is taken at admission and freed when its create and complete are done (or failed).
/// Clones share the slots.
///
/// ```
/// use tower_idempotency::admission::ConcurrencyLimit;
///
/// let limit = ConcurrencyLimit::new(2);
/// assert_eq!(limit.available(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct ConcurrencyLimit {
    slots: Arc<Semaphore>,
}

impl ConcurrencyLimit {
    /// A limit of `n` creates in flight.
    pub fn new(n: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(n)),
        }
    }

    /// Slots free right now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

impl<T> Admission<T> for ConcurrencyLimit {
    type Permit = OwnedSemaphorePermit;

    fn admit(&self, _: &T) -> impl Future<Output = Admit<Self::Permit>> + Send {
        ready(match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => Admit::Proceed(permit),
            Err(_) => Admit::Refuse(Refusal::ServiceUnavailable),
        })
    }
}

/// At most `n` admitted creates per second, with bursts up to `n`; beyond that, `429`
/// ([`Refusal::TooManyRequests`]). A token bucket; clones share it.
///
/// ```
/// use tower_idempotency::admission::RateLimit;
///
/// let limit = RateLimit::per_second(50);
/// # drop(limit);
/// ```
#[derive(Debug, Clone)]
pub struct RateLimit {
    bucket: Arc<Mutex<Bucket>>,
    per_second: f64,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl RateLimit {
    /// A limit of `n` admitted creates per second. `0` refuses everything.
    pub fn per_second(n: u32) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(Bucket {
                tokens: f64::from(n),
                refilled: Instant::now(),
            })),
            per_second: f64::from(n),
        }
    }

    fn take(&self, now: Instant) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(bucket.refilled);
        bucket.tokens =
            (bucket.tokens + elapsed.as_secs_f64() * self.per_second).min(self.per_second);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl<T> Admission<T> for RateLimit {
    type Permit = ();

    fn admit(&self, _: &T) -> impl Future<Output = Admit> + Send {
        ready(if self.take(Instant::now()) {
            Admit::Proceed(())
        } else {
            Admit::Refuse(Refusal::TooManyRequests)
        })
    }
}

/// Why admission refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over a rate: `429 Too Many Requests`.
    TooManyRequests,
    /// Over capacity: `503 Service Unavailable`.
    ServiceUnavailable,
}

impl Refusal {
    /// The status of the reply: 429 or 503.
    ///
    /// ```
    /// use tower_idempotency::admission::Refusal;
    /// assert_eq!(Refusal::TooManyRequests.status(), 429);
    /// assert_eq!(Refusal::ServiceUnavailable.status(), 503);
    /// ```
    pub fn status(self) -> StatusCode {
        match self {
            Self::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            Self::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}
