//! Purging a SQLite store's expired records, in batches that leave the file's write lock to
//! the claims between them.

use super::*;

/// Expired records [`SqliteStore::purge_expired`] deletes in one statement at most: a few
/// milliseconds of the file's write lock.
pub const PURGE_BATCH: u64 = 5_000;

/// The longest pause between two batches of a purge.
pub(super) const MAX_PURGE_PAUSE: Duration = Duration::from_millis(50);

/// The pause after a batch of a purge that took `batch`: four times as long, so that the
/// purge holds the file's write lock a fifth of the time, within a millisecond and
/// [`MAX_PURGE_PAUSE`].
pub(super) fn purge_pause(batch: Duration) -> Duration {
    (batch * 4).clamp(Duration::from_millis(1), MAX_PURGE_PAUSE)
}

/// In batches of [`PURGE_BATCH`] records, oldest first by the expiry index, each one statement
/// well within the store's timeout, until none is left. So it finishes at any backlog, and
/// the claims of every process of the host take their turns at the file's write lock
/// between its batches. One process of the host purging is enough.
///
/// ```no_run
/// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
/// use std::time::Duration;
/// use tower_idempotency::store::{SqliteStore, Purge};
///
/// let store = SqliteStore::open("idempotency.db").await?;
/// store.migrate().await?;
/// let purger = store.purge_every(Duration::from_secs(3600))?;
/// // … serve; the purger stops when dropped.
/// # drop(purger);
/// # Ok(()) }
/// ```
impl Purge for SqliteStore {
    async fn purge_expired_counting(&self, purged: &mut u64) -> Result<(), StoreError> {
        let batch = i64::try_from(PURGE_BATCH).unwrap_or(i64::MAX);
        loop {
            let started = std::time::Instant::now();
            let deleted = self
                .call(async |connection| {
                    sqlx::query(
                        "DELETE FROM idempotency_records WHERE key IN (SELECT key \
                         FROM idempotency_records WHERE expires_at <= ?1 \
                         ORDER BY expires_at LIMIT ?2)",
                    )
                    .bind(now_millis())
                    .bind(batch)
                    .execute(connection)
                    .await
                    .map(|done| done.rows_affected())
                })
                .await?;
            *purged += deleted;
            if deleted < PURGE_BATCH {
                return Ok(());
            }
            // SQLite's write lock is not fair: a writer of another process polls for it
            // (busy_timeout) and would miss it if the next batch took it at once. A pause of
            // four times the batch keeps the purge to a fifth of the lock's time.
            tokio::time::sleep(purge_pause(started.elapsed())).await;
        }
    }
}
