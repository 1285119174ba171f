//! The registry of operations: the [`Store`] trait and its backends.
//!
//! A store keeps one record per idempotency key: the fingerprint of the operation that claimed
//! it and either a *pending* reservation or the *completed* response. [`Store::claim`] is the one
//! atomic entry to it; [`Store::complete`] and [`Store::release`] act only on the reservation
//! the claim handed out, so a stale attempt can never overwrite a completed record or delete
//! someone else's reservation.
//!
//! [`MemoryStore`] is the reference implementation and the embedded default. The shared,
//! durable backends live behind cargo features. [`DynStore`] puts any of them behind one type,
//! for an application that picks its store from its configuration.
//!
//! # Writing a store
//!
//! A store for another backend (DynamoDB, etcd, FoundationDB, …) depends on
//! [`tower-idempotency-core`](tower_idempotency_core) alone, which says what each call of
//! [`Store`] must guarantee, and implements [`Store`], and [`Operator`] for the operator's
//! tools. Then hold it to the same suite the built-in stores run, with the `test-util`
//! feature: `tower_idempotency::store_conformance!` in a test file (the suite is
//! `tower_idempotency::testing::conformance`). The repository's `examples/toy-store` crate is a
//! complete store written that way, with the public API alone.
//!
//! ```
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::store::Store;
//! use tower_idempotency::operation::Fingerprint;
//! use tower_idempotency::store::{Claim, StoredResponse};
//! use http::{HeaderMap, StatusCode};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::new();
//! let fp = Fingerprint::digest(["label-req-7", "parcel-42"]);
//!
//! let Ok(Claim::New(reservation)) = store.claim("label-req-7", &fp).await else { panic!() };
//! assert!(matches!(store.claim("label-req-7", &fp).await, Ok(Claim::Pending)));
//!
//! let created = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), "{}".into());
//! store.complete("label-req-7", &reservation, &created).await.unwrap();
//! let Ok(Claim::Replay(replayed)) = store.claim("label-req-7", &fp).await else { panic!() };
//! assert_eq!(replayed, created);
//! # }
//! ```

mod dynamic;
mod memory;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use tower_idempotency_redis as redis;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use tower_idempotency_sqlx::mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use tower_idempotency_sqlx::postgres;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use tower_idempotency_sqlx::sqlite;

use tower_idempotency_core::backend::waiting;
use tower_idempotency_core::codec;
pub use tower_idempotency_core::{
    Answer, CHANGE_POLL_INTERVAL, Claim, DEFAULT_RETENTION, DEFAULT_TIMEOUT, DEFAULT_TOMBSTONES,
    Decision, Found, Lease, MAX_RETENTION, Operator, Purge, Purger, RecordInfo, RecordState,
    Reservation, Store, StoreError, StoreErrorKind, StoreOptions, StoredResponse, Tombstone, Write,
    decide,
};

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::RedisStore;
pub use dynamic::DynStore;
pub use memory::{MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use tower_idempotency_sqlx::SqliteStore;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use tower_idempotency_sqlx::{MySqlStore, MySqlTransaction, TransactionalMySqlStore};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use tower_idempotency_sqlx::{PgTransaction, PostgresStore, TransactionalPostgresStore};
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use tower_idempotency_sqlx::{SqlTransaction, SqlTransactionConnection};

/// The most records a [`MemoryStore`] holds, pending and completed, unless told otherwise:
/// one million. A record costs about 250 bytes of its own beside its key and its response:
/// about 450 MB of the process's memory for a million keys of 49 bytes (a UUID on
/// `POST /labels`) with responses of 155 bytes, more for longer keys and responses. Past it a
/// claim of a new key is refused: the layer answers the operation's *store unavailable*
/// (`503`, `Retry-After: 2`) and creates nothing, while replays and pending keys keep their
/// answers. Set another bound with [`MemoryStoreBuilder::max_records`], or none with
/// [`MemoryStoreBuilder::unbounded`]; a process without a bound grows with every distinct key its
/// clients send.
pub const DEFAULT_MAX_RECORDS: usize = 1_000_000;

/// The default bound on the bytes a [`MemoryStore`]'s records take: 1 GiB (see
/// [`MemoryStoreBuilder::max_bytes`] for what a record counts, and why this).
pub const DEFAULT_MAX_BYTES: usize = 1 << 30;
