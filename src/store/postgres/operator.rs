//! The operator's view of a PostgreSQL store.

use std::time::Duration;

use bytes::Bytes;

use crate::fingerprint::Fingerprint;
use crate::store::codec;
use crate::store::{
    Operator, RecordInfo, RecordState, StoreError, StoreErrorKind, StoredResponse, within,
};

use sqlx::{AssertSqlSafe, Row as _, SqlSafeStr as _};

use super::{
    PostgresStore, begin_on, corrupt, guarded, statement_timeout_ms, table_key, unavailable,
};

impl Operator for PostgresStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let key = &*table_key(key);
        let inspect = sqlx::query(self.sql.inspect.clone()).bind(key);
        let Some(row) = self.fetch_optional(inspect).await? else {
            return Ok(None);
        };
        let fingerprint: &str = row.try_get(0).map_err(corrupt)?;
        let pending: bool = row.try_get(1).map_err(corrupt)?;
        let response: Option<&[u8]> = row.try_get(2).map_err(corrupt)?;
        let age: i64 = row.try_get(3).map_err(corrupt)?;
        let abandoned: bool = row.try_get(4).map_err(corrupt)?;
        let status = match response {
            Some(response) => Some(codec::decode(Bytes::copy_from_slice(response))?.status()),
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
        let begin = AssertSqlSafe(format!(
            "BEGIN; SET LOCAL statement_timeout = {}",
            statement_timeout_ms(listing)
        ))
        .into_sql_str();
        let rows = within(listing, async {
            let mut transaction = begin_on(self.connections.pool(), begin).await?;
            let rows = sqlx::query(self.sql.pending.clone())
                .bind(millis)
                .fetch_all(&mut *transaction)
                .await
                .map_err(unavailable)?;
            transaction.commit().await.map_err(unavailable)?;
            Ok(rows)
        })
        .await?;
        rows.iter()
            .map(|row| row.try_get::<String, _>(0).map_err(corrupt))
            .collect()
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        let key = &*table_key(key);
        let encoded = codec::encode(response);
        let resolve = sqlx::query(self.sql.resolve.clone())
            .bind(key)
            .bind(&encoded[..])
            .bind(self.retention_ms);
        guarded(self.change(resolve, key).await?)
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let key = &*table_key(key);
        let forget = sqlx::query(self.sql.forget.clone()).bind(key);
        Ok(self.change(forget, key).await? > 0)
    }
}
