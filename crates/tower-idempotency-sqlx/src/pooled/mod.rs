//! What the stores on a sqlx pool of a server (PostgreSQL, MySQL) share: how a connection is
//! had, and the key as their tables hold it.

use std::borrow::Cow;
use std::time::Duration;

use sha2::{Digest, Sha256};

use tower_idempotency_core::{StoreError, StoreErrorKind};

/// The longest key kept as it is, in bytes. An index row holds a few thousand bytes at most
/// (about 2,700 in a PostgreSQL btree, 3,072 in InnoDB), so a longer key is kept as `sha256:`
/// and its digest: any key a request can carry works.
pub(crate) const MAX_KEY_BYTES: usize = 512;

/// The key as the table holds it: itself, or the digest of a long one. A digest form never
/// equals a key the layer makes (those start with a method or a scope's length).
pub(crate) fn table_key(key: &str) -> Cow<'_, str> {
    if key.len() <= MAX_KEY_BYTES {
        Cow::Borrowed(key)
    } else {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        Cow::Owned(format!("sha256:{}", hex::encode(digest)))
    }
}

/// The longest a connection is waited for in a task of its own ([`acquire`]).
const DETACHED_ACQUIRE: Duration = Duration::from_secs(5);

/// A connection of `pool`. When none is idle the pool makes one, in a task of its own: a
/// caller that gives up (its timeout) then leaves the connection to the pool rather than
/// throwing it away half made. Under a timeout shorter than a connection takes to make
/// (TLS, a loaded server), every call would throw its one away, and the pool, emptied by an
/// outage, would never fill again.
pub(crate) async fn acquire<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
) -> Result<sqlx::pool::PoolConnection<DB>, StoreError> {
    let unavailable = |error: sqlx::Error| match error {
        sqlx::Error::PoolTimedOut => StoreError::with_source(StoreErrorKind::Timeout, error),
        error => StoreError::with_source(StoreErrorKind::Unavailable, error),
    };
    if pool.num_idle() > 0 {
        return pool.acquire().await.map_err(unavailable);
    }
    let pool = pool.clone();
    // Bounded, so that callers that gave up during an outage leave no queue of waiting
    // tasks ahead of later ones for longer than this.
    tokio::spawn(async move {
        tokio::time::timeout(DETACHED_ACQUIRE, pool.acquire())
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
    })
    .await
    .map_err(|error| StoreError::with_source(StoreErrorKind::Unavailable, error))?
    .map_err(unavailable)
}

/// Refuses a table name that is not letters, digits and `_`, not starting with a digit, at
/// most 48 characters: it is written into the statements.
pub(crate) fn valid_table(name: &str) -> Result<(), StoreError> {
    let valid = !name.is_empty()
        && name.len() <= 48
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(StoreError::with_source(
            StoreErrorKind::InvalidConfig,
            format!(
                "table {name:?}: letters, digits and _, not starting with a digit, at most 48 \
                 characters"
            ),
        ))
    }
}

mod kept;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod transaction;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod transactional;

#[cfg(feature = "mysql")]
pub(crate) use self::kept::OwnSession;
pub(crate) use self::kept::{Connections, on_connection};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use self::transaction::{Open, OpenTransactions, roll_back};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use self::transaction::{SqlTransaction, SqlTransactionConnection};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use self::transactional::{
    operator_on_committed, transactional_calls, transactional_store,
};
