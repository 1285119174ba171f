//! Purging a SQLite store's expired records, in batches that leave the file's write lock to
//! the claims between them.

use super::*;
use crate::dialect::deleting;

/// Expired records [`SqliteStore::purge_expired`] deletes in one statement at most. Each batch
/// after the first is sized to take about 20 ms: halved after a longer one (down to 100
/// records), doubled after a quick one (up to this), and halved and tried again after one
/// that ran past the store's timeout.
pub const PURGE_BATCH: u64 = 5_000;

/// Records past their replay window and within their tombstone's become tombstones (their
/// response dropped, counted as purged); records past both, or with no tombstone, are
/// deleted. In batches of at most [`PURGE_BATCH`] records, oldest first by the expiry index,
/// each batch two statements (the tombstones, then the deletions) on its first records, each
/// statement well within the store's timeout, until none is left. So it finishes at any
/// backlog, and the claims of every process of the host take their turns at the file's write
/// lock between its batches, which pause four times a batch's time. One process of the host
/// purging is enough.
///
/// ```no_run
/// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
/// use std::time::Duration;
/// use tower_idempotency_sqlx::SqliteStore;
/// use tower_idempotency_core::Purge;
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
        // SQLite's write lock is not fair: a writer of another process polls for it
        // (busy_timeout) and would miss it if the next batch took it at once. The pause of
        // four times the batch keeps the purge to a fifth of the lock's time. A batch past the
        // timeout is tried again halved; one given up on still runs to its end, before the
        // write connection is had again.
        let timed_out = |error: &StoreError| error.kind() == StoreErrorKind::Timeout;
        // Each batch looks at the first records past their expiry, oldest first: those
        // within their tombstone's window lose their response and have their expiry moved to
        // the tombstone's end (where the index finds them again, and not before); then, of
        // the first records past their expiry now, those past their tombstone's window (or
        // with none) are deleted. Each statement reads at most a batch of the index, whatever
        // mix of records it holds; the two together change a whole batch while one is left.
        let purge = deleting::<Sqlite, _>(|connection, batch| {
            let now = now_millis();
            Box::pin(async move {
                let buried = sqlx::query(
                    "UPDATE idempotency_records SET response = NULL, \
                     expires_at = tombstone_until WHERE key IN (SELECT key \
                     FROM idempotency_records WHERE expires_at <= ?1 \
                     ORDER BY expires_at LIMIT ?2) AND tombstone_until > ?1",
                )
                .bind(now)
                .bind(batch)
                .execute(&mut *connection)
                .await?
                .rows_affected();
                let deleted = sqlx::query(
                    "DELETE FROM idempotency_records WHERE key IN (SELECT key \
                     FROM idempotency_records WHERE expires_at <= ?1 \
                     ORDER BY expires_at LIMIT ?2) \
                     AND (tombstone_until IS NULL OR tombstone_until <= ?1)",
                )
                .bind(now)
                .bind(batch)
                .execute(&mut *connection)
                .await?
                .rows_affected();
                Ok(buried + deleted)
            })
        });
        let base = &self.base;
        base.purge_paced(purged, PURGE_BATCH, unavailable, timed_out, purge)
            .await
    }
}
