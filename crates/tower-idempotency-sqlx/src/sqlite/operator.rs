//! The operator's view of a SQLite store's records.

use super::*;
use crate::dialect::View;
use crate::dialect::expired_info;
use tower_idempotency_core::Fingerprint;

impl View for SqliteStore {
    async fn inspect_record(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let row = self
            .look(async |connection| read(connection, key).await)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let (fingerprint, token, response, lease_until, changed_at) =
            (row.0, row.1, row.2, row.3, row.6);
        let now = now_millis();
        let fingerprint = Fingerprint::parse(&fingerprint)
            .ok_or_else(|| StoreError::new(StoreErrorKind::Corrupt))?;
        let age = u64::try_from(now.saturating_sub(changed_at))
            .ok()
            .map(Duration::from_millis);
        if token.is_some() {
            let abandoned = lease_until.is_some_and(|until| until <= now);
            return Ok(Some(RecordInfo::pending(fingerprint, age, abandoned)));
        }
        let expired = row.5.is_some_and(|at| at <= now);
        let remembered = row.8.is_some_and(|until| until > now);
        Ok(Some(match (response, row.7) {
            (None, Some(tombstone)) if remembered => {
                expired_info(fingerprint, age, &tombstone, row.8)?
            }
            // A tombstone past its window, not purged yet: absent, as to a claim.
            (None, Some(_)) => return Ok(None),
            (Some(_), Some(tombstone)) if expired && remembered => {
                expired_info(fingerprint, age, &tombstone, row.8)?
            }
            (Some(response), _) => {
                let status = codec::decode(Bytes::from(response))?.status();
                RecordInfo::completed(fingerprint, age, status)
            }
            (None, None) => RecordInfo::pending(fingerprint, age, false),
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
