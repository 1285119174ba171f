//! What the transactional stores (PostgreSQL, MySQL) answer alike, written once: a database's
//! own are only how its transaction begins (`begin`), its claim in that transaction
//! (`claim_in`) and the statement that completes the record in it (`completing`). Each store
//! expands [`transactional_store!`] beside its own impl of those, its `open` being its
//! [`OpenTransactions`](super::OpenTransactions) and its `store` its plain store.

/// The inherent calls, `Debug`, `Store` and `Operator` of the transactional store `$store` over
/// the plain store `$plain`.
macro_rules! transactional_store {
    ($store:ident, $plain:ident) => {
        impl $store {
            #[doc = concat!(
                                "The plain store underneath: for [`migrate`](", stringify!($plain),
                                "::migrate), the operator's calls and the pool."
                            )]
            pub fn store(&self) -> &$plain {
                &self.store
            }

            /// Transactions open now: one per create in flight.
            pub fn open_transactions(&self) -> usize {
                self.open.len()
            }
        }

        impl ::std::fmt::Debug for $store {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($store))
                    .field("store", &self.store)
                    .finish_non_exhaustive()
            }
        }

        impl ::tower_idempotency_core::Store for $store {
            /// Begins a transaction and claims in it (see the store's docs): a new claim keeps
            /// it open for the create; any other answer only read, and rolls it back.
            async fn claim_with(
                &self,
                key: &str,
                fingerprint: &::tower_idempotency_core::Fingerprint,
                reservation: ::tower_idempotency_core::Reservation,
                lease: ::tower_idempotency_core::Lease,
            ) -> Result<::tower_idempotency_core::Claim, ::tower_idempotency_core::StoreError> {
                use ::tower_idempotency_core::Claim;
                use ::tower_idempotency_core::backend::within;
                let timeout = self.store.base.timeout();
                let mut transaction = within(timeout, self.begin()).await?;
                // Any error or cancellation below drops the transaction: rolled back.
                let claiming = $crate::dialect::Claiming {
                    key,
                    fingerprint,
                    reservation,
                    lease,
                };
                match within(timeout, self.claim_in(&mut transaction, claiming)).await? {
                    Claim::New(reservation) => {
                        self.open.insert(&reservation, transaction);
                        Ok(Claim::New(reservation))
                    }
                    claim => {
                        // Nothing was written: a replay, pending or conflicting claim only
                        // read. Its answer stands however the rollback goes (dropped, the
                        // transaction rolls back when its connection is next looked at).
                        $crate::pooled::roll_back(transaction, timeout).await;
                        Ok(claim)
                    }
                }
            }

            /// Stores the response in the claim's transaction and commits: the record, the
            /// create's writes and the response together. Any failure is
            /// [`StoreErrorKind::Uncommitted`](tower_idempotency_core::StoreErrorKind::Uncommitted).
            async fn complete(
                &self,
                key: &str,
                reservation: &::tower_idempotency_core::Reservation,
                response: &::tower_idempotency_core::StoredResponse,
            ) -> Result<(), ::tower_idempotency_core::StoreError> {
                let key = &*$crate::pooled::table_key(key);
                let token = $crate::dialect::token(reservation);
                let completion = $crate::dialect::Completion::new(&self.store.base.options, response);
                let complete = self.completing(key, &token, &completion);
                let timeout = self.store.base.timeout();
                let run = async |connection: &mut _| {
                    let done = complete.execute(connection).await?;
                    Ok(done.rows_affected())
                };
                self.open
                    .complete(reservation, timeout, response, run)
                    .await
            }

            $crate::pooled::transactional_calls!();
        }

        $crate::pooled::operator_on_committed!($store);
    };
}

/// The calls of `Store` a transactional store answers alike on every database: the claim's
/// open transaction holds the key (nothing to renew, settle or announce), a release or an
/// abandon rolls it back with the create's writes, and the create gets the transaction
/// attached to its request.
macro_rules! transactional_calls {
    () => {
        /// Nothing to renew: the open transaction holds the key for as long as the create
        /// runs.
        async fn renew(
            &self,
            _key: &str,
            reservation: &::tower_idempotency_core::Reservation,
            _lease: ::std::time::Duration,
        ) -> Result<(), ::tower_idempotency_core::StoreError> {
            self.open.renew(reservation)
        }

        /// Nothing to settle: a claim whose answer was lost ran in a transaction that was
        /// rolled back when it was dropped, or on a connection that was then closed.
        async fn settle_claim(
            &self,
            _key: &str,
            _fingerprint: &::tower_idempotency_core::Fingerprint,
            _reservation: ::tower_idempotency_core::Reservation,
        ) -> Result<(), ::tower_idempotency_core::StoreError> {
            Ok(())
        }

        /// Polls: an open transaction's end is not announced.
        fn changed<'a>(
            &'a self,
            key: &'a str,
        ) -> impl ::std::future::Future<Output = ()> + Send + 'a {
            let _ = key;
            ::tokio::time::sleep(::tower_idempotency_core::CHANGE_POLL_INTERVAL)
        }

        /// Rolls the claim back: the key is free, as before the claim.
        async fn release(
            &self,
            _key: &str,
            reservation: &::tower_idempotency_core::Reservation,
        ) -> Result<(), ::tower_idempotency_core::StoreError> {
            self.open
                .release(reservation, self.store.base.timeout())
                .await
        }

        fn attach(
            &self,
            _key: &str,
            reservation: &::tower_idempotency_core::Reservation,
            extensions: &mut ::http::Extensions,
        ) {
            self.open.attach(reservation, extensions);
        }

        /// A release rolls the claim's transaction back, with the create's writes.
        fn release_undoes_create(&self) -> bool {
            true
        }

        /// The plain store's retention.
        fn replay_window(&self) -> Option<::std::time::Duration> {
            self.store.options().retention_window()
        }

        /// The plain store's tombstone window.
        fn tombstone_window(&self) -> Option<::std::time::Duration> {
            self.store.options().tombstone_window()
        }

        /// Rolls back: the create's writes with the claim, so the key is free again.
        async fn abandon(&self, _key: &str, reservation: &::tower_idempotency_core::Reservation) {
            self.open
                .roll_back(reservation, self.store.base.timeout())
                .await;
        }
    };
}

/// `Operator` for the transactional store `$store`: its calls act on the committed records, as
/// on its plain store (`self.store`): a transaction in flight is not a record yet.
macro_rules! operator_on_committed {
    ($store:ty) => {
        /// The operator's calls act on the committed records, as on the plain store: a
        /// transaction in flight is not a record yet.
        impl ::tower_idempotency_core::Operator for $store {
            async fn inspect(
                &self,
                key: &str,
            ) -> Result<
                Option<::tower_idempotency_core::RecordInfo>,
                ::tower_idempotency_core::StoreError,
            > {
                ::tower_idempotency_core::Operator::inspect(&self.store, key).await
            }

            async fn pending_older_than(
                &self,
                age: ::std::time::Duration,
            ) -> Result<Vec<String>, ::tower_idempotency_core::StoreError> {
                ::tower_idempotency_core::Operator::pending_older_than(&self.store, age).await
            }

            async fn resolve(
                &self,
                key: &str,
                response: &::tower_idempotency_core::StoredResponse,
            ) -> Result<(), ::tower_idempotency_core::StoreError> {
                ::tower_idempotency_core::Operator::resolve(&self.store, key, response).await
            }

            async fn forget(
                &self,
                key: &str,
            ) -> Result<bool, ::tower_idempotency_core::StoreError> {
                ::tower_idempotency_core::Operator::forget(&self.store, key).await
            }
        }
    };
}

pub(crate) use {operator_on_committed, transactional_calls, transactional_store};
