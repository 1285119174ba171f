//! The operator's view of a PostgreSQL store.

use std::time::Duration;

use bytes::Bytes;

use crate::fingerprint::Fingerprint;
use crate::store::codec;
use crate::store::{
    Operator, RecordInfo, RecordState, StoreError, StoreErrorKind, StoredResponse, within,
};

use super::{PostgresStore, guarded, statement_timeout_ms, table_key, unavailable};

impl Operator for PostgresStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let key = &*table_key(key);
        let row = self.query_opt(&self.sql.inspect, &[&key]).await?;
        let Some(row) = row else { return Ok(None) };
        let corrupt = |e| StoreError::with_source(StoreErrorKind::Corrupt, e);
        let fingerprint: &str = row.try_get(0).map_err(corrupt)?;
        let pending: bool = row.try_get(1).map_err(corrupt)?;
        let response: Option<Vec<u8>> = row.try_get(2).map_err(corrupt)?;
        let age: i64 = row.try_get(3).map_err(corrupt)?;
        let abandoned: bool = row.try_get(4).map_err(corrupt)?;
        let status = match response {
            Some(response) => Some(codec::decode(Bytes::from(response))?.status()),
            None => None,
        };
        Ok(Some(RecordInfo {
            state: if pending {
                RecordState::Pending
            } else {
                RecordState::Completed
            },
            age: u64::try_from(age).ok().map(Duration::from_millis),
            fingerprint: Fingerprint::parse(fingerprint)
                .ok_or_else(|| StoreError::new(StoreErrorKind::Corrupt))?,
            status,
            abandoned,
        }))
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        let millis =
            i64::try_from(age.min(crate::store::MAX_RETENTION).as_millis()).unwrap_or(i64::MAX);
        // A listing scans the table: ten store timeouts, on the client's side and as the
        // statement's own `statement_timeout` (the pool's connections carry one timeout), set
        // for its transaction alone.
        let listing = self.timeout.saturating_mul(10);
        let rows = within(listing, async {
            let mut client = self.client().await?;
            let transaction = client.transaction().await.map_err(unavailable)?;
            transaction
                .batch_execute(&format!(
                    "SET LOCAL statement_timeout = {}",
                    statement_timeout_ms(listing)
                ))
                .await
                .map_err(unavailable)?;
            let rows = transaction
                .query(&self.sql.pending, &[&millis])
                .await
                .map_err(unavailable)?;
            transaction.commit().await.map_err(unavailable)?;
            Ok(rows)
        })
        .await?;
        rows.iter()
            .map(|row| {
                row.try_get::<_, String>(0)
                    .map_err(|e| StoreError::with_source(StoreErrorKind::Corrupt, e))
            })
            .collect()
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        let key = &*table_key(key);
        let encoded = codec::encode(response);
        let rows = self
            .change(
                &self.sql.resolve,
                key,
                &[&key, &&encoded[..], &self.retention_ms],
            )
            .await?;
        guarded(rows)
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let key = &*table_key(key);
        Ok(self.change(&self.sql.forget, key, &[&key]).await? > 0)
    }
}
