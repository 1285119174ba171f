//! A store chosen at run time: [`DynStore`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Claim, Lease, Operator, RecordInfo, Reservation, Store, StoreError, StoreErrorKind,
    StoredResponse,
};
use crate::fingerprint::Fingerprint;

/// A boxed future of a store call.
type Call<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Any [`Store`] behind one type, so that an application can pick its store from its
/// configuration (memory here, Redis there) without being generic over it. It is an
/// [`Operator`] too, over a store that is one (every built-in store is).
///
/// Every call goes to the store it wraps, unchanged, so it keeps every guarantee of that
/// store; [`changed`](Store::changed) is asked of it when called, as the trait requires. The
/// price is one boxed future per call (a claim, a complete): a few tens of nanoseconds, far
/// below a remote store's round trip; a claim the store answers at once
/// ([`claim_now`](Store::claim_now)) is answered at once through it too. Clones share the store.
///
/// ```
/// use tower_idempotency::store::DynStore;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
///
/// fn store_from(url: &str) -> DynStore {
///     match url {
///         "memory" => DynStore::new(MemoryStore::new()),
///         // "redis://…" => DynStore::new(RedisStore::connect(url).await?), and so on.
///         other => panic!("unsupported store {other}"),
///     }
/// }
///
/// let layer = IdempotencyLayer::new(store_from("memory"), JsonOperation::new()).global_keys();
/// # drop(layer);
/// ```
#[derive(Clone)]
pub struct DynStore {
    store: Arc<dyn ObjectStore>,
    /// The same store as an operator, if it is one.
    operator: Option<Arc<dyn ObjectOperator>>,
    name: &'static str,
}

impl DynStore {
    /// Wraps `store`, an [`Operator`] as every built-in store is.
    pub fn new<St: Operator>(store: St) -> Self {
        let store = Arc::new(store);
        Self {
            operator: Some(Arc::clone(&store) as Arc<dyn ObjectOperator>),
            store,
            name: std::any::type_name::<St>(),
        }
    }

    /// Wraps `store`, which offers no [`Operator`] calls: through the wrapper they fail with
    /// [`StoreErrorKind::Unsupported`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use tower_idempotency::store::{DynStore, Operator};
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::StoreErrorKind;
    ///
    /// let store = DynStore::without_operator(MemoryStore::new());
    /// let error = store.forget("k").await.unwrap_err();
    /// assert_eq!(error.kind(), StoreErrorKind::Unsupported);
    /// # }
    /// ```
    pub fn without_operator<St: Store>(store: St) -> Self {
        Self {
            store: Arc::new(store),
            operator: None,
            name: std::any::type_name::<St>(),
        }
    }

    fn operator(&self) -> Result<&dyn ObjectOperator, StoreError> {
        self.operator
            .as_deref()
            .ok_or_else(|| StoreError::new(StoreErrorKind::Unsupported))
    }
}

impl fmt::Debug for DynStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DynStore").field(&self.name).finish()
    }
}

/// [`Store`] with boxed futures, so that it can be a trait object.
trait ObjectStore: Send + Sync + 'static {
    fn claim_with<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Call<'a, Result<Claim, StoreError>>;

    fn claim<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a Fingerprint,
    ) -> Call<'a, Result<Claim, StoreError>>;

    fn claim_now(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Option<Result<Claim, StoreError>>;

    fn renew<'a>(
        &'a self,
        key: &'a str,
        reservation: &'a Reservation,
        lease: Duration,
    ) -> Call<'a, Result<(), StoreError>>;

    fn complete<'a>(
        &'a self,
        key: &'a str,
        reservation: &'a Reservation,
        response: &'a StoredResponse,
    ) -> Call<'a, Result<(), StoreError>>;

    fn settle_claim<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a Fingerprint,
        reservation: Reservation,
    ) -> Call<'a, Result<(), StoreError>>;

    fn changed<'a>(&'a self, key: &'a str) -> Call<'a, ()>;

    fn release<'a>(
        &'a self,
        key: &'a str,
        reservation: &'a Reservation,
    ) -> Call<'a, Result<(), StoreError>>;

    fn attach(&self, key: &str, reservation: &Reservation, extensions: &mut http::Extensions);

    fn release_undoes_create(&self) -> bool;

    fn replay_window(&self) -> Option<Duration>;

    fn tombstone_window(&self) -> Option<Duration>;

    fn abandon<'a>(&'a self, key: &'a str, reservation: &'a Reservation) -> Call<'a, ()>;
}

/// [`Operator`] with boxed futures.
trait ObjectOperator: Send + Sync + 'static {
    fn inspect<'a>(&'a self, key: &'a str) -> Call<'a, Result<Option<RecordInfo>, StoreError>>;

    fn pending_older_than(&self, age: Duration) -> Call<'_, Result<Vec<String>, StoreError>>;

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        response: &'a StoredResponse,
    ) -> Call<'a, Result<(), StoreError>>;

    fn forget<'a>(&'a self, key: &'a str) -> Call<'a, Result<bool, StoreError>>;
}

impl<St: Operator> ObjectOperator for St {
    fn inspect<'a>(&'a self, key: &'a str) -> Call<'a, Result<Option<RecordInfo>, StoreError>> {
        Box::pin(Operator::inspect(self, key))
    }

    fn pending_older_than(&self, age: Duration) -> Call<'_, Result<Vec<String>, StoreError>> {
        Box::pin(Operator::pending_older_than(self, age))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        response: &'a StoredResponse,
    ) -> Call<'a, Result<(), StoreError>> {
        Box::pin(Operator::resolve(self, key, response))
    }

    fn forget<'a>(&'a self, key: &'a str) -> Call<'a, Result<bool, StoreError>> {
        Box::pin(Operator::forget(self, key))
    }
}

impl<St: Store> ObjectStore for St {
    fn claim_with<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Call<'a, Result<Claim, StoreError>> {
        Box::pin(Store::claim_with(
            self,
            key,
            fingerprint,
            reservation,
            lease,
        ))
    }

    fn claim<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a Fingerprint,
    ) -> Call<'a, Result<Claim, StoreError>> {
        Box::pin(Store::claim(self, key, fingerprint))
    }

    fn claim_now(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Option<Result<Claim, StoreError>> {
        Store::claim_now(self, key, fingerprint, reservation, lease)
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        reservation: &'a Reservation,
        lease: Duration,
    ) -> Call<'a, Result<(), StoreError>> {
        Box::pin(Store::renew(self, key, reservation, lease))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        reservation: &'a Reservation,
        response: &'a StoredResponse,
    ) -> Call<'a, Result<(), StoreError>> {
        Box::pin(Store::complete(self, key, reservation, response))
    }

    fn settle_claim<'a>(
        &'a self,
        key: &'a str,
        fingerprint: &'a Fingerprint,
        reservation: Reservation,
    ) -> Call<'a, Result<(), StoreError>> {
        Box::pin(Store::settle_claim(self, key, fingerprint, reservation))
    }

    fn changed<'a>(&'a self, key: &'a str) -> Call<'a, ()> {
        Box::pin(Store::changed(self, key))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        reservation: &'a Reservation,
    ) -> Call<'a, Result<(), StoreError>> {
        Box::pin(Store::release(self, key, reservation))
    }

    fn attach(&self, key: &str, reservation: &Reservation, extensions: &mut http::Extensions) {
        Store::attach(self, key, reservation, extensions);
    }

    fn release_undoes_create(&self) -> bool {
        Store::release_undoes_create(self)
    }

    fn replay_window(&self) -> Option<Duration> {
        Store::replay_window(self)
    }

    fn tombstone_window(&self) -> Option<Duration> {
        Store::tombstone_window(self)
    }

    fn abandon<'a>(&'a self, key: &'a str, reservation: &'a Reservation) -> Call<'a, ()> {
        Box::pin(Store::abandon(self, key, reservation))
    }
}

impl Store for DynStore {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        self.store
            .claim_with(key, fingerprint, reservation, lease)
            .await
    }

    async fn claim(&self, key: &str, fingerprint: &Fingerprint) -> Result<Claim, StoreError> {
        self.store.claim(key, fingerprint).await
    }

    fn claim_now(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Option<Result<Claim, StoreError>> {
        self.store.claim_now(key, fingerprint, reservation, lease)
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.store.renew(key, reservation, lease).await
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.store.complete(key, reservation, response).await
    }

    async fn settle_claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
    ) -> Result<(), StoreError> {
        self.store.settle_claim(key, fingerprint, reservation).await
    }

    /// Asks the wrapped store when called, so a change made before the first poll is seen.
    fn changed<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        self.store.changed(key)
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        self.store.release(key, reservation).await
    }

    fn attach(&self, key: &str, reservation: &Reservation, extensions: &mut http::Extensions) {
        self.store.attach(key, reservation, extensions);
    }

    fn release_undoes_create(&self) -> bool {
        self.store.release_undoes_create()
    }

    fn replay_window(&self) -> Option<Duration> {
        self.store.replay_window()
    }

    fn tombstone_window(&self) -> Option<Duration> {
        self.store.tombstone_window()
    }

    fn abandon<'a>(
        &'a self,
        key: &'a str,
        reservation: &'a Reservation,
    ) -> impl Future<Output = ()> + Send + 'a {
        self.store.abandon(key, reservation)
    }
}

impl Operator for DynStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        self.operator()?.inspect(key).await
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        self.operator()?.pending_older_than(age).await
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        self.operator()?.resolve(key, response).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        self.operator()?.forget(key).await
    }
}
