//! The operator's view of a SQLite store's records.

use super::*;

impl Operator for SqliteStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let row = self
            .look(async |connection| read(connection, key).await)
            .await?;
        let Some((fingerprint, _, response, lease_until, _, _, changed_at)) = row else {
            return Ok(None);
        };
        let now = now_millis();
        let fingerprint = Fingerprint::parse(&fingerprint)
            .ok_or_else(|| StoreError::new(StoreErrorKind::Corrupt))?;
        let age = u64::try_from(now.saturating_sub(changed_at))
            .ok()
            .map(Duration::from_millis);
        Ok(Some(match response {
            Some(response) => RecordInfo::completed(
                fingerprint,
                age,
                codec::decode(Bytes::from(response))?.status(),
            ),
            None => RecordInfo::pending(
                fingerprint,
                age,
                lease_until.is_some_and(|until| until <= now),
            ),
        }))
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        let age =
            i64::try_from(age.min(crate::store::MAX_RETENTION).as_millis()).unwrap_or(i64::MAX);
        let before = now_millis().saturating_sub(age);
        self.look(async |connection| {
            sqlx::query_scalar(
                "SELECT key FROM idempotency_records WHERE token IS NOT NULL \
                 AND changed_at <= ?1 ORDER BY key",
            )
            .bind(before)
            .fetch_all(connection)
            .await
        })
        .await
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        self.store_response(key, None, response).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let rows = self
            .call(async |connection| {
                sqlx::query("DELETE FROM idempotency_records WHERE key = ?1")
                    .bind(key)
                    .execute(connection)
                    .await
                    .map(|done| done.rows_affected())
            })
            .await?;
        self.wake(key);
        Ok(rows > 0)
    }
}
