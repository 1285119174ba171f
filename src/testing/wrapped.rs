//! One forwarding store for the crate's own fault-injecting test stores: each wraps a store
//! and acts around its calls ([`Around`]); every call of [`Store`] is forwarded once, here.

use std::future::Future;
use std::time::Duration;

use crate::operation::Fingerprint;
use crate::store::{Claim, Lease, Reservation, Store, StoreError, StoredResponse};

/// What a wrapping test store does around the calls of the store it wraps.
pub(crate) trait Around: Clone + Send + Sync + 'static {
    /// Runs the wrapped store's call named `call` (`"claim"`, `"renew"`, `"complete"`,
    /// `"settle"` or `"release"`): `run` is that call, to run, to hold, or to answer in its
    /// place.
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: &'static str,
        run: impl Future<Output = Result<T, StoreError>> + Send + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'a;

    /// Attaches to a new claim's request in place of the wrapped store (`true`), or leaves
    /// it to the wrapped store (`false`, the default).
    fn attach(&self, _key: &str, _extensions: &mut http::Extensions) -> bool {
        false
    }
}

/// The store `inner`, with `around` acting around its calls.
#[derive(Clone)]
pub(crate) struct Wrapped<St, A> {
    pub(crate) inner: St,
    pub(crate) around: A,
}

impl<St: Store, A: Around> Store for Wrapped<St, A> {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let run = self.inner.claim_with(key, fingerprint, reservation, lease);
        self.around.around("claim", run).await
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let run = self.inner.renew(key, reservation, lease);
        self.around.around("renew", run).await
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let run = self.inner.complete(key, reservation, response);
        self.around.around("complete", run).await
    }

    async fn settle_claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
    ) -> Result<(), StoreError> {
        let run = self.inner.settle_claim(key, fingerprint, reservation);
        self.around.around("settle", run).await
    }

    fn changed<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        self.inner.changed(key)
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        let run = self.inner.release(key, reservation);
        self.around.around("release", run).await
    }

    fn attach(&self, key: &str, reservation: &Reservation, extensions: &mut http::Extensions) {
        if !self.around.attach(key, extensions) {
            self.inner.attach(key, reservation, extensions);
        }
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
        self.inner.abandon(key, reservation).await;
    }
}
