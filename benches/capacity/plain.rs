//! The floor of each SQL store: the statements the store sends for a create (its claim, then
//! its complete) and for a replay (its claim), written plainly on the same sqlx pool, or on
//! pools made as the store makes its own. No timeout around them, no connection kept between
//! calls, no decoding of what a replay reads, no fencing beyond what the statements hold:
//! what any store on the same driver would pay for the same round trips and writes.
//!
//! The statements are copied from the stores' own (a change there must be made here too for
//! the floor to stay the same work), with the table's name in them.

#[allow(unused_imports)]
use super::*;

use tower_idempotency::store::mysql::sqlx::MySqlPool;
use tower_idempotency::store::postgres::sqlx::PgPool;
use tower_idempotency::store::sqlite::sqlx::SqlitePool;

/// One SQL store's statements on its driver's pool(s).
#[derive(Clone)]
pub(crate) enum Plain {
    Postgres {
        pool: PgPool,
        claim: Arc<str>,
        complete: Arc<str>,
    },
    MySql {
        pool: MySqlPool,
        insert: Arc<str>,
        read: Arc<str>,
        complete: Arc<str>,
    },
    Sqlite {
        writes: SqlitePool,
        reads: SqlitePool,
    },
}

/// A token as the stores keep one: 16 bytes.
fn token(key: &str) -> [u8; 16] {
    let mut token = [0u8; 16];
    for (i, byte) in key.bytes().enumerate() {
        token[i % 16] ^= byte;
    }
    token
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64
}

const LEASE_MS: i64 = 30_000;
const TIMEOUT_MS: i64 = 1_000;
const RETENTION_MS: i64 = 24 * 3600 * 1000;

/// MySQL's clock in milliseconds, as the store writes it.
const MYSQL_NOW_MS: &str = "(UNIX_TIMESTAMP() * 1000 + MICROSECOND(NOW(6)) DIV 1000)";

/// SQLite's statements, as the store sends them.
const SQLITE_SELECT: &str = "SELECT fingerprint, token, response, lease_until, take_over, \
    expires_at, changed_at FROM idempotency_records WHERE key = ?1";
const SQLITE_RESERVE: &str = "INSERT INTO idempotency_records \
    (key, fingerprint, token, response, lease_until, take_over, changed_at, expires_at) \
    SELECT ?1, ?2, ?3, NULL, ?4, ?5, ?6, NULL \
    WHERE CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) < ?7 \
    ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, \
    token = excluded.token, response = NULL, lease_until = excluded.lease_until, \
    take_over = excluded.take_over, changed_at = excluded.changed_at, expires_at = NULL \
    WHERE (response IS NOT NULL AND expires_at <= ?6) \
    OR (response IS NULL AND take_over AND ?8 AND fingerprint = excluded.fingerprint \
    AND (lease_until IS NULL OR lease_until <= ?6) AND token IS NOT ?3)";
const SQLITE_COMPLETE: &str = "UPDATE idempotency_records SET response = ?3, token = NULL, \
    lease_until = NULL, changed_at = ?4, expires_at = ?5 \
    WHERE key = ?1 AND token IS NOT NULL AND (?2 IS NULL OR token = ?2)";

/// PostgreSQL's claim statement, its row.
async fn postgres_claim(
    pool: &PgPool,
    claim: &Arc<str>,
    key: &str,
    fingerprint: &str,
    token: &[u8; 16],
) -> tower_idempotency::store::postgres::sqlx::postgres::PgRow {
    sqlx::query(sqlx::AssertSqlSafe(Arc::clone(claim)))
        .bind(key)
        .bind(fingerprint)
        .bind(&token[..])
        .bind(LEASE_MS)
        .bind(false)
        .bind(TIMEOUT_MS)
        .bind(None::<i64>)
        .fetch_one(pool)
        .await
        .expect("the claim")
}

/// MySQL's claim insert: the rows it inserted (1 for a new key).
async fn mysql_insert(
    pool: &MySqlPool,
    insert: &Arc<str>,
    key: &str,
    fingerprint: &str,
    token: &[u8; 16],
) -> u64 {
    sqlx::query(sqlx::AssertSqlSafe(Arc::clone(insert)))
        .bind(key)
        .bind(fingerprint)
        .bind(&token[..])
        .bind(LEASE_MS)
        .bind(false)
        .execute(pool)
        .await
        .expect("the claim")
        .rows_affected()
}

impl Plain {
    /// PostgreSQL's claim and complete on `pool`, for `table`.
    pub(crate) fn postgres(pool: PgPool, table: &str) -> Self {
        let quoted = format!("\"{table}\"");
        let lease = "now() + $4::bigint * interval '1 millisecond'";
        let in_time = "1 / (clock_timestamp() < COALESCE(to_timestamp($7::bigint::float8 / 1000000), \
             statement_timestamp() + $6::bigint * interval '1 millisecond'))::int = 1";
        let server_now = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";
        Plain::Postgres {
            pool,
            claim: format!(
                "WITH inserted AS (\
                 INSERT INTO {quoted} (key, fingerprint, token, lease_until, take_over, waited) \
                 VALUES ($1, $2, $3, {lease}, $5, false) \
                 ON CONFLICT (key) DO NOTHING \
                 RETURNING token, fingerprint, response, false AS expired, false AS lapsed) \
                 SELECT token, fingerprint, response, expired, lapsed, {server_now} \
                 FROM inserted WHERE {in_time} \
                 UNION ALL \
                 SELECT token, fingerprint, response, COALESCE(expires_at <= now(), false), \
                 COALESCE(lease_until <= now() AND take_over, false), {server_now} \
                 FROM {quoted} WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM inserted)"
            )
            .into(),
            complete: format!(
                "UPDATE {quoted} SET response = $3, token = NULL, lease_until = NULL, \
                 changed_at = now(), expires_at = CASE \
                 WHEN $4::bigint > 0 THEN now() + $4::bigint * interval '1 millisecond' END \
                 WHERE key = $1 AND token = $2 RETURNING waited"
            )
            .into(),
        }
    }

    /// MySQL's claim (the insert, and the read of a key it found) and complete on `pool`.
    pub(crate) fn mysql(pool: MySqlPool, table: &str) -> Self {
        let quoted = format!("`{table}`");
        Plain::MySql {
            pool,
            insert: format!(
                "INSERT IGNORE INTO {quoted} (`key`, fingerprint, token, lease_until, take_over, \
                 changed_at) VALUES (?, ?, ?, {MYSQL_NOW_MS} + ?, ?, {MYSQL_NOW_MS})"
            )
            .into(),
            read: format!(
                "SELECT token, fingerprint, response, COALESCE(expires_at <= {MYSQL_NOW_MS}, 0), \
                 COALESCE(token IS NOT NULL AND take_over AND lease_until <= {MYSQL_NOW_MS}, 0) \
                 FROM {quoted} WHERE `key` = ?"
            )
            .into(),
            complete: format!(
                "UPDATE {quoted} SET response = ?, token = NULL, lease_until = NULL, \
                 changed_at = {MYSQL_NOW_MS}, expires_at = IF(? > 0, {MYSQL_NOW_MS} + ?, NULL) \
                 WHERE `key` = ? AND token = ?"
            )
            .into(),
        }
    }

    /// SQLite's claim (the read, then the write) and complete: the writes on `writes`, the
    /// reads on `reads`, as the store splits them.
    pub(crate) fn sqlite(writes: SqlitePool, reads: SqlitePool) -> Self {
        Plain::Sqlite { writes, reads }
    }

    /// A create of `key`: the claim, which must write the key, then the complete.
    pub(crate) async fn create(&self, key: &str, fingerprint: &str, response: &[u8]) {
        let token = token(key);
        match self {
            Plain::Postgres {
                pool,
                claim,
                complete,
            } => {
                let row = postgres_claim(pool, claim, key, fingerprint, &token).await;
                let written: Option<&[u8]> = sqlx::Row::get(&row, 0);
                assert_eq!(written, Some(&token[..]), "{key}: not new");
                let done = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(complete)))
                    .bind(key)
                    .bind(&token[..])
                    .bind(response)
                    .bind(RETENTION_MS)
                    .fetch_all(pool)
                    .await
                    .expect("the complete");
                assert_eq!(done.len(), 1, "{key}: not completed");
            }
            Plain::MySql {
                pool,
                insert,
                complete,
                ..
            } => {
                let inserted = mysql_insert(pool, insert, key, fingerprint, &token).await;
                assert_eq!(inserted, 1, "{key}: not new");
                let done = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(complete)))
                    .bind(response)
                    .bind(RETENTION_MS)
                    .bind(RETENTION_MS)
                    .bind(key)
                    .bind(&token[..])
                    .execute(pool)
                    .await
                    .expect("the complete")
                    .rows_affected();
                assert_eq!(done, 1, "{key}: not completed");
            }
            Plain::Sqlite { writes, reads } => {
                let found = sqlx::query(SQLITE_SELECT)
                    .bind(key)
                    .fetch_optional(reads)
                    .await
                    .expect("the claim's read");
                assert!(found.is_none(), "{key}: not new");
                let now = now_ms();
                let reserved = sqlx::query(SQLITE_RESERVE)
                    .bind(key)
                    .bind(fingerprint)
                    .bind(&token[..])
                    .bind(now + LEASE_MS)
                    .bind(false)
                    .bind(now)
                    .bind(now + TIMEOUT_MS)
                    .bind(false)
                    .execute(writes)
                    .await
                    .expect("the claim's write")
                    .rows_affected();
                assert_eq!(reserved, 1, "{key}: not new");
                let now = now_ms();
                let done = sqlx::query(SQLITE_COMPLETE)
                    .bind(key)
                    .bind(&token[..])
                    .bind(response)
                    .bind(now)
                    .bind(now + RETENTION_MS)
                    .execute(writes)
                    .await
                    .expect("the complete")
                    .rows_affected();
                assert_eq!(done, 1, "{key}: not completed");
            }
        }
    }

    /// A replay of `key`: the claim, which finds its completed record and reads its response.
    pub(crate) async fn replay(&self, key: &str, fingerprint: &str) {
        let token = token(key);
        let response: Option<Vec<u8>> = match self {
            Plain::Postgres { pool, claim, .. } => {
                let row = postgres_claim(pool, claim, key, fingerprint, &token).await;
                sqlx::Row::get(&row, 2)
            }
            Plain::MySql {
                pool, insert, read, ..
            } => {
                let inserted = mysql_insert(pool, insert, key, fingerprint, &token).await;
                assert_eq!(inserted, 0, "{key}: new");
                let row = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(read)))
                    .bind(key)
                    .fetch_one(pool)
                    .await
                    .expect("the read");
                sqlx::Row::get(&row, 2)
            }
            Plain::Sqlite { reads, .. } => {
                let row = sqlx::query(SQLITE_SELECT)
                    .bind(key)
                    .fetch_one(reads)
                    .await
                    .expect("the claim's read");
                sqlx::Row::get(&row, 2)
            }
        };
        assert!(response.is_some(), "{key}: no response");
    }
}
