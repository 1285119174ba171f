//! The SQL stores of [`tower-idempotency`](https://docs.rs/tower-idempotency) on sqlx, each
//! behind a feature: [PostgreSQL](postgres) (`postgres`), [MySQL and MariaDB](mysql)
//! (`mysql`) and [SQLite](sqlite) (`sqlite`). Each claim is one statement in one round trip;
//! the PostgreSQL and MySQL stores also come transactional, the create's own writes committed
//! in the claim's transaction, exactly once.
//!
//! Applications use them through the facade's features of the same names, at
//! `tower_idempotency::store` (`PostgresStore`, `MySqlStore`, `SqliteStore`, …):
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
//! use tower_idempotency_sqlx::PostgresStore;
//! use tower_idempotency::{IdempotencyLayer, JsonOperation};
//!
//! let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! store.migrate().await?;
//! let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
//! # drop(layer); Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod dialect;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod pacing;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
mod pooled;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use mysql::{MySqlStore, MySqlTransaction, TransactionalMySqlStore};
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use pooled::{SqlTransaction, SqlTransactionConnection};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PgTransaction, PostgresStore, TransactionalPostgresStore};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;
