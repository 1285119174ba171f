//! The operator's view of a SQLite store's records.

use super::*;
use crate::dialect::View;
use tower_idempotency_core::Fingerprint;

impl View for SqliteStore {
    async fn inspect_record(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
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

    async fn pending_keys(&self, age: i64) -> Result<Vec<String>, StoreError> {
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
}
