//! The one SQL core: what every SQL store answers alike, written once here, over what each
//! database does its own way, its [`Dialect`]. A claim, a complete, a release, the operator's
//! resolve and forget are each one flow ([`sql_store!`]): the reservation's token, the
//! encoded response, the guard that exactly one record changed, the waking of this process's
//! waiters. A database's module holds its statements and only what differs: how its claim is
//! one atomic step, how a lost claim is settled, how waiters learn of another replica's change.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_idempotency_core::CHANGE_POLL_INTERVAL;
use tower_idempotency_core::backend::waiting::{self, WaiterMap, Waiters as _};

use tower_idempotency_core::{
    Claim, Fingerprint, Found, Lease, RecordInfo, Reservation, StoreError, StoreErrorKind,
    StoreOptions,
};

use crate::pooled::{Connections, on_connection};

/// A reservation's token as the tables hold it: its 128 bits, big-endian.
pub(crate) type Token = [u8; 16];

/// The records a statement changed, or why it failed.
pub(crate) type Rows = Result<u64, StoreError>;

/// The token of `reservation`.
pub(crate) fn token(reservation: &Reservation) -> Token {
    reservation.as_u128().to_be_bytes()
}

/// A change guarded by a reservation: exactly one record changed, or the reservation is lost.
pub(crate) fn guarded(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::new(StoreErrorKind::ReservationLost))
    }
}

/// A duration in whole milliseconds, as the statements take it (at most a hundred years).
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(tower_idempotency_core::backend::retention_millis(duration)).unwrap_or(i64::MAX)
}

/// An age in whole milliseconds, as a listing compares it: zero stays zero (every pending key
/// is at least that old), and past a hundred years it is clamped.
pub(crate) fn age_millis(age: Duration) -> i64 {
    let age = age.min(tower_idempotency_core::MAX_RETENTION);
    i64::try_from(age.as_millis()).unwrap_or(i64::MAX)
}

/// What a complete writes: the encoded response and, on a store that keeps tombstones, the
/// tombstone it leaves once its replay window passed.
pub(crate) struct Completion {
    /// The response, encoded.
    pub(crate) response: bytes::Bytes,
    /// The tombstone's bytes (its completion time, status and `Location`), or `None` on a
    /// store that keeps no tombstones (or keeps records for good).
    pub(crate) tombstone: Option<bytes::Bytes>,
    /// Milliseconds from the complete to the end of the tombstone's window (the retention and
    /// the tombstone window after it); `0` with no tombstone.
    pub(crate) tombstone_ms: i64,
}

impl Completion {
    /// What completing with `response` writes on a store of `options`, completed now.
    pub(crate) fn new(
        options: &StoreOptions,
        response: &tower_idempotency_core::StoredResponse,
    ) -> Self {
        let encoded = tower_idempotency_core::codec::encode(response);
        let Some(tombstones) = options.tombstone_window() else {
            return Self {
                response: encoded,
                tombstone: None,
                tombstone_ms: 0,
            };
        };
        let tombstone =
            tower_idempotency_core::Tombstone::of(response, std::time::SystemTime::now());
        let retention_ms = i64::try_from(options.retention_ms()).unwrap_or(i64::MAX);
        Self {
            response: encoded,
            tombstone: Some(tombstone.to_bytes()),
            tombstone_ms: retention_ms.saturating_add(millis(tombstones)),
        }
    }

    /// The tombstone's bytes as a statement binds them.
    pub(crate) fn tombstone(&self) -> Option<&[u8]> {
        self.tombstone.as_deref()
    }
}

/// A completed record as a claim reads it, in the terms of the claim's decision; `None` when
/// the record holds neither a response nor a tombstone (a pending one).
///
/// A record keeps its response for its replay window (`expired`: past it) and its tombstone
/// until the end of the tombstone's (`remembered`: not past it). The purge drops the response
/// of a record past its replay window and within its tombstone's (buried: no response), and
/// deletes a record past both.
pub(crate) fn completed<R>(
    same_fingerprint: bool,
    response: Option<R>,
    tombstone: Option<R>,
    expired: bool,
    remembered: bool,
) -> Option<Found<R>> {
    Some(match (response, tombstone) {
        (Some(response), _) if !expired => Found::Completed {
            same_fingerprint,
            expired: false,
            response,
        },
        (_, Some(tombstone)) if remembered => Found::Expired {
            same_fingerprint,
            tombstone,
        },
        // Past both windows: absent.
        (Some(gone), _) | (None, Some(gone)) => Found::Completed {
            same_fingerprint,
            expired: true,
            response: gone,
        },
        (None, None) => return None,
    })
}

/// The operator's view of a record past its replay window, remembered by its `tombstone`
/// until `until_ms` (milliseconds since 1970).
pub(crate) fn expired_info(
    fingerprint: Fingerprint,
    age: Option<Duration>,
    tombstone: &[u8],
    until_ms: Option<i64>,
) -> Result<RecordInfo, StoreError> {
    let tombstone = tower_idempotency_core::Tombstone::from_bytes(tombstone)?;
    let until = until_ms
        .and_then(|ms| u64::try_from(ms).ok())
        .and_then(|ms| std::time::UNIX_EPOCH.checked_add(Duration::from_millis(ms)));
    Ok(RecordInfo::expired(fingerprint, age, tombstone, until))
}

/// A record as a server's inspect statement reads it back.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct Inspected<'r> {
    pub(crate) fingerprint: Fingerprint,
    /// Since it was claimed or completed.
    pub(crate) age: Option<Duration>,
    /// It holds a reservation.
    pub(crate) pending: bool,
    /// Pending, its lease lapsed.
    pub(crate) abandoned: bool,
    pub(crate) response: Option<&'r [u8]>,
    pub(crate) tombstone: Option<&'r [u8]>,
    /// Past its replay window.
    pub(crate) expired: bool,
    /// Within its tombstone's window.
    pub(crate) remembered: bool,
    /// When its tombstone's window ends, in milliseconds since 1970.
    pub(crate) until: Option<i64>,
}

/// The operator's view of a record a server's inspect read: pending, completed with its
/// response's status, or expired by its tombstone; `None` for a tombstone past its window not
/// purged yet, absent as to a claim.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn record_info(record: Inspected<'_>) -> Result<Option<RecordInfo>, StoreError> {
    let Inspected {
        fingerprint,
        age,
        pending,
        ..
    } = record;
    match (pending, record.response, record.tombstone) {
        (false, None, Some(tombstone)) if record.remembered => {
            return expired_info(fingerprint, age, tombstone, record.until).map(Some);
        }
        (false, None, Some(_)) => return Ok(None),
        (false, Some(_), Some(tombstone)) if record.expired && record.remembered => {
            return expired_info(fingerprint, age, tombstone, record.until).map(Some);
        }
        _ => {}
    }
    let status = match record.response {
        Some(response) => Some(
            tower_idempotency_core::codec::decode(bytes::Bytes::copy_from_slice(response))?
                .status(),
        ),
        None => None,
    };
    let state = if pending {
        tower_idempotency_core::RecordState::Pending
    } else {
        tower_idempotency_core::RecordState::Completed
    };
    Ok(Some(RecordInfo::new(
        state,
        fingerprint,
        age,
        status,
        record.abandoned,
    )))
}

/// The lease a claim runs under on a store of `options`: a store that keeps no tombstones
/// forgets any a record holds (written by another replica, or an earlier setting), so that a
/// key past its replay window is new there, as its options say.
pub(crate) fn lease_on(options: &StoreOptions, lease: Lease) -> Lease {
    if options.tombstone_window().is_none() {
        lease.forget_expired()
    } else {
        lease
    }
}

/// The lease a claim decides with on the committed record while another transaction holds
/// the key: no take-over, and expired operations forgotten as the claim's own `lease` says.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn while_held(lease: Lease) -> Lease {
    if lease.forgets_expired() {
        Lease::default().forget_expired()
    } else {
        Lease::default()
    }
}

/// A claim as a dialect takes it: the key as the layer made it, and what the caller claims it
/// with.
#[derive(Clone, Copy)]
pub(crate) struct Claiming<'a> {
    pub(crate) key: &'a str,
    pub(crate) fingerprint: &'a Fingerprint,
    pub(crate) reservation: Reservation,
    pub(crate) lease: Lease,
}

/// What every SQL store holds alike: the connections its calls run on, and its options.
pub(crate) struct Base<DB: sqlx::Database> {
    pub(crate) connections: Connections<DB>,
    pub(crate) options: StoreOptions,
}

impl<DB: sqlx::Database> Clone for Base<DB> {
    fn clone(&self) -> Self {
        Self {
            connections: self.connections.clone(),
            options: self.options,
        }
    }
}

impl<DB: sqlx::Database> Base<DB> {
    /// The defaults on `pool`.
    pub(crate) fn new(pool: sqlx::Pool<DB>) -> Self {
        Self {
            connections: Connections::new(pool),
            options: StoreOptions::new(),
        }
    }

    /// One store call's bound.
    pub(crate) fn timeout(&self) -> Duration {
        self.options.call_timeout()
    }

    /// The retention as the statements take it: whole milliseconds, `0` for records kept until
    /// forgotten.
    pub(crate) fn retention_ms(&self) -> i64 {
        i64::try_from(self.options.retention_ms()).unwrap_or(i64::MAX)
    }

    /// Runs `call` on one of the connections, bounded by the timeout, its driver's error
    /// mapped by `unavailable` (the dialect's reading of it).
    pub(crate) async fn call<T>(
        &self,
        unavailable: fn(sqlx::Error) -> StoreError,
        call: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, sqlx::Error>,
    ) -> Result<T, StoreError> {
        on_connection(&self.connections, self.timeout(), async |connection| {
            call(connection).await.map_err(unavailable)
        })
        .await
    }

    /// Purges in paced batches ([`paced`](crate::pacing::paced)) on the store's connections:
    /// `delete` runs one batch's statement, given its size, and answers the records it
    /// deleted.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) async fn purge_paced(
        &self,
        purged: &mut u64,
        largest: u64,
        unavailable: fn(sqlx::Error) -> StoreError,
        retried: impl Fn(&StoreError) -> bool,
        delete: impl for<'c> Fn(&'c mut DB::Connection, i64) -> Deleting<'c>,
    ) -> Result<(), StoreError> {
        let sent = &std::sync::atomic::AtomicBool::new(false);
        let delete = &delete;
        let batch = |batch| async move {
            self.call(unavailable, async |connection| {
                // The statement's own time, not the wait for a connection: a busy pool must
                // not shrink the batches.
                sent.store(true, std::sync::atomic::Ordering::Relaxed);
                let started = std::time::Instant::now();
                let deleted = delete(connection, batch).await?;
                Ok((deleted, started.elapsed()))
            })
            .await
        };
        crate::pacing::paced(purged, largest, self.timeout(), retried, sent, batch).await
    }

    /// The store's `Debug`: its name, its table and its options.
    pub(crate) fn debug(
        &self,
        f: &mut std::fmt::Formatter<'_>,
        name: &str,
        table: &str,
    ) -> std::fmt::Result {
        f.debug_struct(name)
            .field("table", &table)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// One purge batch's statement, running: the records it deleted.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) type Deleting<'c> =
    std::pin::Pin<Box<dyn Future<Output = Result<u64, sqlx::Error>> + Send + 'c>>;

/// `delete` as [`Base::purge_paced`] takes it: for a connection of any lifetime.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn deleting<DB: sqlx::Database, F>(delete: F) -> F
where
    F: for<'c> Fn(&'c mut DB::Connection, i64) -> Deleting<'c>,
{
    delete
}

/// The requests of this process waiting for a key, on a store whose database announces
/// nothing: woken by this process's own changes, polling for the others'.
#[derive(Clone, Default)]
pub(crate) struct LocalWaiters(Arc<Mutex<WaiterMap>>);

impl LocalWaiters {
    /// How many keys are waited on.
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    pub(crate) fn len(&self) -> usize {
        let waiters = self.0.lock();
        waiters
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

/// What a SQL store does its own way. The keys it is given are the layer's; a dialect keeps
/// them as its table does (the digest of a long one, on a server's table).
pub(crate) trait Dialect {
    /// The store's options.
    fn store_options(&self) -> &StoreOptions;

    /// The claim, one atomic step of the database.
    async fn claim(&self, claiming: Claiming<'_>) -> Result<Claim, StoreError>;

    /// Extends the lease of `key`'s record pending under `token`.
    async fn renew_rows(&self, key: &str, token: &Token, lease: Duration) -> Rows;

    /// Completes `key`'s record pending under `token`, or whichever is pending when there is
    /// none (an operator's resolve), with `completion`.
    async fn complete_rows(
        &self,
        key: &str,
        token: Option<&Token>,
        completion: &Completion,
    ) -> Rows;

    /// Deletes `key`'s record pending under `token`.
    async fn release_rows(&self, key: &str, token: &Token) -> Rows;

    /// Deletes `key`'s record, whatever its state.
    async fn forget_rows(&self, key: &str) -> Rows;

    /// Settles a claim whose answer was lost (see `Store::settle_claim`).
    async fn settle(&self, claiming: Claiming<'_>) -> Result<(), StoreError>;

    /// This process's waiters, on a database that announces nothing.
    fn local_waiters(&self) -> Option<&LocalWaiters>;

    /// Ends when `key` may have changed (see `Store::changed`): by default when this process
    /// changes it, or after [`CHANGE_POLL_INTERVAL`].
    fn changes<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        let waiting = self
            .local_waiters()
            .map(|waiters| waiting::wait(Arc::clone(&waiters.0), key));
        waiting::until(waiting, CHANGE_POLL_INTERVAL)
    }

    /// Wakes this process's waiters after this process changed `key`.
    fn wake(&self, key: &str) {
        if let Some(waiters) = self.local_waiters() {
            waiters
                .0
                .with_waiters(key, |waiters| waiting::wake(waiters, key));
        }
    }
}

/// The operator's view of a SQL store's records, each database's own statements.
pub(crate) trait View {
    /// `key`'s record.
    async fn inspect_record(&self, key: &str) -> Result<Option<RecordInfo>, StoreError>;

    /// The keys pending for `age_ms` or longer.
    async fn pending_keys(&self, age_ms: i64) -> Result<Vec<String>, StoreError>;
}

/// `Store` and `Operator` for the plain SQL store `$store`, each call written once over its
/// [`Dialect`].
macro_rules! sql_store {
    ($store:ty) => {
        impl ::tower_idempotency_core::Store for $store {
            async fn claim_with(
                &self,
                key: &str,
                fingerprint: &::tower_idempotency_core::Fingerprint,
                reservation: ::tower_idempotency_core::Reservation,
                lease: ::tower_idempotency_core::Lease,
            ) -> Result<::tower_idempotency_core::Claim, ::tower_idempotency_core::StoreError> {
                let claiming = $crate::dialect::Claiming {
                    key,
                    fingerprint,
                    reservation,
                    lease,
                };
                $crate::dialect::Dialect::claim(self, claiming).await
            }

            async fn renew(
                &self,
                key: &str,
                reservation: &::tower_idempotency_core::Reservation,
                lease: ::std::time::Duration,
            ) -> Result<(), ::tower_idempotency_core::StoreError> {
                let token = $crate::dialect::token(reservation);
                let rows = $crate::dialect::Dialect::renew_rows(self, key, &token, lease).await?;
                $crate::dialect::guarded(rows)
            }

            async fn complete(
                &self,
                key: &str,
                reservation: &::tower_idempotency_core::Reservation,
                response: &::tower_idempotency_core::StoredResponse,
            ) -> Result<(), ::tower_idempotency_core::StoreError> {
                let token = $crate::dialect::token(reservation);
                $crate::dialect::store_response(self, key, Some(&token), response).await
            }

            fn changed<'a>(
                &'a self,
                key: &'a str,
            ) -> impl ::std::future::Future<Output = ()> + Send + 'a {
                $crate::dialect::Dialect::changes(self, key)
            }

            async fn settle_claim(
                &self,
                key: &str,
                fingerprint: &::tower_idempotency_core::Fingerprint,
                reservation: ::tower_idempotency_core::Reservation,
            ) -> Result<(), ::tower_idempotency_core::StoreError> {
                let claiming = $crate::dialect::Claiming {
                    key,
                    fingerprint,
                    reservation,
                    lease: ::tower_idempotency_core::Lease::default(),
                };
                $crate::dialect::Dialect::settle(self, claiming).await
            }

            async fn release(
                &self,
                key: &str,
                reservation: &::tower_idempotency_core::Reservation,
            ) -> Result<(), ::tower_idempotency_core::StoreError> {
                let token = $crate::dialect::token(reservation);
                let rows = $crate::dialect::Dialect::release_rows(self, key, &token).await?;
                $crate::dialect::guarded(rows)?;
                $crate::dialect::Dialect::wake(self, key);
                Ok(())
            }

            fn replay_window(&self) -> Option<::std::time::Duration> {
                self.options().retention_window()
            }

            fn tombstone_window(&self) -> Option<::std::time::Duration> {
                self.options().tombstone_window()
            }
        }

        impl ::tower_idempotency_core::Operator for $store {
            async fn inspect(
                &self,
                key: &str,
            ) -> Result<
                Option<::tower_idempotency_core::RecordInfo>,
                ::tower_idempotency_core::StoreError,
            > {
                $crate::dialect::View::inspect_record(self, key).await
            }

            async fn pending_older_than(
                &self,
                age: ::std::time::Duration,
            ) -> Result<Vec<String>, ::tower_idempotency_core::StoreError> {
                let age = $crate::dialect::age_millis(age);
                $crate::dialect::View::pending_keys(self, age).await
            }

            async fn resolve(
                &self,
                key: &str,
                response: &::tower_idempotency_core::StoredResponse,
            ) -> Result<(), ::tower_idempotency_core::StoreError> {
                $crate::dialect::store_response(self, key, None, response).await
            }

            async fn forget(
                &self,
                key: &str,
            ) -> Result<bool, ::tower_idempotency_core::StoreError> {
                let forgotten = $crate::dialect::Dialect::forget_rows(self, key).await? > 0;
                $crate::dialect::Dialect::wake(self, key);
                Ok(forgotten)
            }
        }
    };
}

pub(crate) use sql_store;

/// Completes `key`'s pending record with `response`: the one pending under `token`, or
/// whichever is pending when there is none (an operator's resolve); wakes its waiters.
pub(crate) async fn store_response(
    store: &impl Dialect,
    key: &str,
    token: Option<&Token>,
    response: &tower_idempotency_core::StoredResponse,
) -> Result<(), StoreError> {
    let completion = Completion::new(store.store_options(), response);
    guarded(store.complete_rows(key, token, &completion).await?)?;
    store.wake(key);
    Ok(())
}

/// The shorthands of a store's options, each a [`StoreOptions`] field set through the store's
/// own `with_options`, and their getter. `$timeout` is what the store's timeout does beyond
/// bounding a call.
macro_rules! options_methods {
    ($store:ident, $with_options:literal, $timeout:literal) => {
        /// Runs the store with `options`: its retention, its tombstone window, and its timeout.
        #[doc = ""]
        #[doc = $with_options]
        /// For another timeout a store on its own pool makes the pool afresh (its connections
        /// made on first use), leaving the pool of clones made before as it is: set the options
        /// once, before the store is used and cloned. A clone given another timeout holds a
        /// pool of its own beside the first (on PostgreSQL, a listener too; on SQLite, a writer
        /// connection that takes turns at the file's lock with the first one's).
        ///
        /// ```
        /// use std::time::Duration;
        /// use tower_idempotency_core::StoreOptions;
        #[doc = concat!("use tower_idempotency_sqlx::", stringify!($store), ";")]
        ///
        #[doc = concat!("fn configured(store: ", stringify!($store), ") -> ", stringify!($store), " {")]
        ///     let options = StoreOptions::new()
        ///         .retention(Duration::from_secs(3600))
        ///         .timeout(Duration::from_millis(500));
        ///     let store = store.with_options(options);
        ///     assert_eq!(store.options(), options);
        ///     store
        /// }
        /// ```
        pub fn with_options(mut self, options: ::tower_idempotency_core::StoreOptions) -> Self {
            let retimed = options.call_timeout() != self.base.timeout();
            self.base.options = options;
            if self.own_pool && retimed {
                self.remake_pools(options.call_timeout());
            }
            self
        }

        /// The options the store runs with.
        pub fn options(&self) -> ::tower_idempotency_core::StoreOptions {
            self.base.options
        }

        /// Gives completed records an `expires_at` `retention` after they were completed; from
        /// then on a claim answers expired while the record's tombstone is kept
        /// ([`tombstones`](Self::tombstones)) and treats it as absent after, and
        /// [`purge_expired`](Self::purge_expired) drops its response, then the record. Default: [`DEFAULT_RETENTION`](tower_idempotency_core::DEFAULT_RETENTION),
        /// 24 hours. Pending records never expire. Any duration is accepted; past
        /// [`MAX_RETENTION`](tower_idempotency_core::MAX_RETENTION) (a hundred years) it is
        /// clamped. Shorthand for [`StoreOptions::retention`](tower_idempotency_core::StoreOptions::retention).
        pub fn retention(self, retention: ::std::time::Duration) -> Self {
            let options = self.base.options.retention(retention);
            self.with_options(options)
        }

        /// Remembers a completed record for `tombstones` past its replay window: its
        /// tombstone (when it completed, its status and `Location`) answers a retry with the
        /// same fingerprint as expired ([`Claim::Expired`](tower_idempotency_core::Claim::Expired))
        /// rather than letting it create again; past that, the key is new. The purge drops the
        /// response at the end of the replay window and deletes the record at the end of its
        /// tombstone's. Default:
        /// [`DEFAULT_TOMBSTONES`](tower_idempotency_core::DEFAULT_TOMBSTONES), seven days;
        /// `Duration::ZERO` keeps none. Shorthand for
        /// [`StoreOptions::tombstones`](tower_idempotency_core::StoreOptions::tombstones).
        pub fn tombstones(self, tombstones: ::std::time::Duration) -> Self {
            let options = self.base.options.tombstones(tombstones);
            self.with_options(options)
        }

        /// Keeps completed records until they are forgotten (no `expires_at`), rather than for
        /// the retention window: the table then grows with every key it is sent.
        pub fn keep_forever(self) -> Self {
            let options = self.base.options.keep_forever();
            self.with_options(options)
        }

        /// Sets how long one store call may take, its wait for a connection included. Default
        /// one second. Shorthand for
        /// [`StoreOptions::timeout`](tower_idempotency_core::StoreOptions::timeout).
        #[doc = ""]
        #[doc = $timeout]
        pub fn timeout(self, timeout: ::std::time::Duration) -> Self {
            let options = self.base.options.timeout(timeout);
            self.with_options(options)
        }
    };
}

pub(crate) use options_methods;

#[cfg(test)]
mod tests {
    use super::*;

    /// Found in review: a listing of the keys pending for zero or longer left out a key claimed
    /// in the same millisecond, the age made one millisecond as a lease is.
    #[test]
    fn a_listings_age_keeps_zero_and_is_clamped() {
        assert_eq!(age_millis(Duration::ZERO), 0);
        assert_eq!(age_millis(Duration::from_millis(1_500)), 1_500);
        let most = i64::try_from(tower_idempotency_core::MAX_RETENTION.as_millis()).unwrap();
        assert_eq!(age_millis(Duration::MAX), most);
        assert_eq!(
            millis(Duration::ZERO),
            1,
            "a lease is one millisecond at least"
        );
    }
}
