//! The operator's view of a MySQL store's records.

use super::*;

impl Operator for MySqlStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let inspect = sqlx::query(self.sql.inspect.clone()).bind(&*table_key(key));
        let Some(row) = self.fetch_optional(inspect).await? else {
            return Ok(None);
        };
        let fingerprint: &[u8] = row.try_get(0).map_err(corrupt)?;
        let pending = row.try_get::<i64, _>(1).map_err(corrupt)? != 0;
        let response: Option<&[u8]> = row.try_get(2).map_err(corrupt)?;
        let age: i64 = row.try_get(3).map_err(corrupt)?;
        let abandoned = row.try_get::<i64, _>(4).map_err(corrupt)? != 0;
        let status = match response {
            Some(response) => Some(codec::decode(Bytes::copy_from_slice(response))?.status()),
            None => None,
        };
        let fingerprint = std::str::from_utf8(fingerprint)
            .ok()
            .and_then(Fingerprint::parse)
            .ok_or_else(|| StoreError::new(StoreErrorKind::Corrupt))?;
        Ok(Some(RecordInfo {
            state: if pending {
                RecordState::Pending
            } else {
                RecordState::Completed
            },
            age: u64::try_from(age).ok().map(Duration::from_millis),
            fingerprint,
            status,
            abandoned,
        }))
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        let millis =
            i64::try_from(age.min(crate::store::MAX_RETENTION).as_millis()).unwrap_or(i64::MAX);
        // A listing scans the table: ten store timeouts.
        let listing = self.timeout.saturating_mul(10);
        let keys: Vec<Vec<u8>> = on_connection(&self.connections, listing, async |connection| {
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

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        self.store_response(key, None, response).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let forget = sqlx::query(self.sql.forget.clone()).bind(&*table_key(key));
        let forgotten = self.execute(forget).await? > 0;
        self.wake(key);
        Ok(forgotten)
    }
}
