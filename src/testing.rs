//! Helpers for testing a service behind the layer (feature `test-util`): a journal of calls, a
//! store that records (and on demand fails) its calls, and an admission that answers what the
//! test says.
//!
//! They make the contract's call traces one assertion each:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Response, StatusCode};
//! use tower::{ServiceExt, service_fn};
//! use tower_idempotency::admission::Refusal;
//! use tower_idempotency::testing::{Journal, RecordingStore, ScriptedAdmission};
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//! use tower_idempotency::operation::LabelContract;
//! use tower_idempotency::operation::LabelOperation;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let journal = Journal::new();
//! let admission = ScriptedAdmission::new(journal.clone());
//! let layer = IdempotencyLayer::new(RecordingStore::new(MemoryStore::new(), journal.clone()), LabelContract).global_keys()
//!     .admission(admission.clone());
//! let create = {
//!     let journal = journal.clone();
//!     service_fn(move |_| {
//!         journal.record("create");
//!         async { Ok::<_, Infallible>(Response::builder().status(201).body(String::new()).unwrap()) }
//!     })
//! };
//! let service = tower::Layer::layer(&layer, create);
//! let attempt = || LabelOperation::new("label-req-7", "parcel-42").attempt("/labels").unwrap();
//!
//! admission.refuse(Some(Refusal::TooManyRequests));
//! let refused = service.clone().oneshot(attempt()).await.unwrap();
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(journal.take(), ["claim", "admit", "release"]);
//!
//! admission.refuse(None);
//! service.clone().oneshot(attempt()).await.unwrap();
//! assert_eq!(journal.take(), ["claim", "admit", "create", "complete"]);
//!
//! service.oneshot(attempt()).await.unwrap();
//! assert_eq!(journal.take(), ["claim"]); // a replay calls nothing else
//! # }
//! ```

pub mod conformance;
pub(crate) mod wrapped;

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::admission::{Admission, Admit, Refusal};
use crate::operation::Fingerprint;
use crate::store::{
    Claim, Lease, MemoryStore, Reservation, Store, StoreError, StoreErrorKind, StoredResponse,
};

/// A shared, ordered record of calls: `claim`, `admit`, `release`, `create`, `complete`, and
/// whatever a test records itself (`write`, say). Clones share the record.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    calls: Arc<Mutex<Vec<&'static str>>>,
}

impl Journal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one call.
    pub fn record(&self, call: &'static str) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call);
    }

    /// The calls so far, leaving the journal empty.
    pub fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A store that records each call in a [`Journal`], fails the calls a test names with
/// [`StoreErrorKind::Unavailable`], and otherwise is its inner store.
///
/// ```
/// use tower_idempotency::testing::{Journal, RecordingStore};
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::store::Store;
/// use tower_idempotency::operation::Fingerprint;
/// use tower_idempotency::store::StoreErrorKind;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let journal = Journal::new();
/// let store = RecordingStore::new(MemoryStore::new(), journal.clone());
/// store.fail("claim");
/// let error = store.claim("k", &Fingerprint::digest(["k", "p"])).await.unwrap_err();
/// assert_eq!(error.kind(), StoreErrorKind::Unavailable);
/// assert_eq!(journal.take(), ["claim"]);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RecordingStore<St = MemoryStore> {
    inner: St,
    journal: Journal,
    failing: Arc<Mutex<Vec<&'static str>>>,
}

impl<St> RecordingStore<St> {
    /// Records the calls to `inner` in `journal`.
    pub fn new(inner: St, journal: Journal) -> Self {
        Self {
            inner,
            journal,
            failing: Arc::default(),
        }
    }

    /// Makes every later `call` (`"claim"`, `"renew"`, `"complete"` or `"release"`) fail.
    pub fn fail(&self, call: &'static str) {
        self.failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call);
    }

    /// Makes every call succeed again.
    pub fn recover(&self) {
        self.failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The inner store.
    pub fn inner(&self) -> &St {
        &self.inner
    }

    fn call(&self, call: &'static str) -> Result<(), StoreError> {
        self.journal.record(call);
        let failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        if failing.contains(&call) {
            Err(StoreError::new(StoreErrorKind::Unavailable))
        } else {
            Ok(())
        }
    }
}

impl<St: Store> Store for RecordingStore<St> {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        self.call("claim")?;
        self.inner
            .claim_with(key, fingerprint, reservation, lease)
            .await
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.call("complete")?;
        self.inner.complete(key, reservation, response).await
    }

    fn changed<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        self.inner.changed(key)
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.call("renew")?;
        self.inner.renew(key, reservation, lease).await
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        self.call("release")?;
        self.inner.release(key, reservation).await
    }

    fn attach(&self, key: &str, reservation: &Reservation, extensions: &mut http::Extensions) {
        self.inner.attach(key, reservation, extensions);
    }

    fn release_undoes_create(&self) -> bool {
        self.inner.release_undoes_create()
    }

    fn replay_window(&self) -> Option<Duration> {
        self.inner.replay_window()
    }

    fn tombstone_window(&self) -> Option<Duration> {
        self.inner.tombstone_window()
    }

    async fn abandon(&self, key: &str, reservation: &Reservation) {
        self.journal.record("abandon");
        self.inner.abandon(key, reservation).await;
    }

    async fn settle_claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
    ) -> Result<(), StoreError> {
        self.call("settle")?;
        self.inner.settle_claim(key, fingerprint, reservation).await
    }
}

/// An admission that records each call as `admit` and answers what the test last set:
/// proceed (the default) or a refusal. Clones share the answer.
#[derive(Debug, Clone)]
pub struct ScriptedAdmission {
    journal: Journal,
    refusal: Arc<Mutex<Option<Refusal>>>,
}

impl ScriptedAdmission {
    /// An admission that proceeds, recording into `journal`.
    pub fn new(journal: Journal) -> Self {
        Self {
            journal,
            refusal: Arc::default(),
        }
    }

    /// Refuses every later admission with `refusal`, or proceeds again with `None`.
    pub fn refuse(&self, refusal: Option<Refusal>) {
        *self.refusal.lock().unwrap_or_else(PoisonError::into_inner) = refusal;
    }
}

impl<T> Admission<T> for ScriptedAdmission {
    type Permit = ();

    fn admit(&self, _: &T) -> impl Future<Output = Admit> + Send {
        self.journal.record("admit");
        let refusal = *self.refusal.lock().unwrap_or_else(PoisonError::into_inner);
        std::future::ready(match refusal {
            Some(refusal) => Admit::Refuse(refusal),
            None => Admit::Proceed(()),
        })
    }
}
