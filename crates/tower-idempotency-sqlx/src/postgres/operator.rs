//! The operator's view of a PostgreSQL store.

use std::time::Duration;

use tower_idempotency_core::Fingerprint;
use tower_idempotency_core::backend::within;
use tower_idempotency_core::{RecordInfo, StoreError, StoreErrorKind};

use sqlx::{AssertSqlSafe, Row as _, SqlSafeStr as _};

use crate::dialect::{Inspected, View, record_info};

use super::{PostgresStore, begin_on, corrupt, statement_timeout_ms, table_key, unavailable};

impl View for PostgresStore {
    async fn inspect_record(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
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
        let tombstone: Option<&[u8]> = row.try_get(5).map_err(corrupt)?;
        let expired: bool = row.try_get(6).map_err(corrupt)?;
        let remembered: bool = row.try_get(7).map_err(corrupt)?;
        let until: Option<i64> = row.try_get(8).map_err(corrupt)?;
        let fingerprint = Fingerprint::parse(fingerprint)
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
        // A listing scans the table: ten store timeouts, on the client's side and as the
        // statement's own `statement_timeout` (the pool's connections carry one timeout), set
        // for its transaction alone.
        let listing = self.base.timeout().saturating_mul(10);
        let begin = AssertSqlSafe(format!(
            "BEGIN; SET LOCAL statement_timeout = {}",
            statement_timeout_ms(listing)
        ))
        .into_sql_str();
        let rows = within(listing, async {
            let mut transaction = begin_on(self.pool(), begin).await?;
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
}
