//! The operator's view of a MySQL store's records.

use super::*;
use crate::dialect::{Inspected, View, record_info};

impl View for MySqlStore {
    async fn inspect_record(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let inspect = sqlx::query(self.sql.inspect.clone()).bind(&*table_key(key));
        let Some(row) = self.fetch_optional(inspect).await? else {
            return Ok(None);
        };
        let fingerprint: &[u8] = row.try_get(0).map_err(corrupt)?;
        let pending = row.try_get::<i64, _>(1).map_err(corrupt)? != 0;
        let response: Option<&[u8]> = row.try_get(2).map_err(corrupt)?;
        let age: i64 = row.try_get(3).map_err(corrupt)?;
        let abandoned = row.try_get::<i64, _>(4).map_err(corrupt)? != 0;
        let tombstone: Option<&[u8]> = row.try_get(5).map_err(corrupt)?;
        let expired = row.try_get::<i64, _>(6).map_err(corrupt)? != 0;
        let remembered = row.try_get::<i64, _>(7).map_err(corrupt)? != 0;
        let until: Option<i64> = row.try_get(8).map_err(corrupt)?;
        let fingerprint = std::str::from_utf8(fingerprint)
            .ok()
            .and_then(Fingerprint::parse)
            .ok_or_else(|| StoreError::new(StoreErrorKind::Corrupt))?;
        record_info(Inspected {
            fingerprint,
            age: u64::try_from(age).ok().map(Duration::from_millis),
            pending,
            abandoned,
            response,
            tombstone,
            expired,
            remembered,
            until,
        })
    }

    async fn pending_keys(&self, millis: i64) -> Result<Vec<String>, StoreError> {
        // A listing scans the table: ten store timeouts.
        let listing = self.base.timeout().saturating_mul(10);
        let keys: Vec<Vec<u8>> =
            on_connection(&self.base.connections, listing, async |connection| {
                sqlx::query_scalar(self.sql.pending.clone())
                    .bind(millis)
                    .fetch_all(connection)
                    .await
                    .map_err(unavailable)
            })
            .await?;
        keys.into_iter()
            .map(|key| {
                String::from_utf8(key)
                    .map_err(|e| StoreError::with_source(StoreErrorKind::Corrupt, e))
            })
            .collect()
    }
}
