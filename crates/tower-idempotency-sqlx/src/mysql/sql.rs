//! The store's SQL, written once per table: every statement a call runs.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// A statement built once: shared by every call (a clone is a reference count, no copy).
fn statement(sql: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(sql)).into_sql_str()
}

/// Now, in milliseconds since 1970, on the server's clock, whatever the session's time zone:
/// both parts are the statement's start (a time zone moves whole minutes).
pub(super) const NOW_MS: &str = "(UNIX_TIMESTAMP() * 1000 + MICROSECOND(NOW(6)) DIV 1000)";

/// The statements, built once for the table name.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) table: String,
    pub(super) insert: SqlStr,
    pub(super) read: SqlStr,
    pub(super) read_locked: SqlStr,
    pub(super) insert_locked: SqlStr,
    pub(super) insert_nowait: SqlStr,
    pub(super) take_over: SqlStr,
    pub(super) take_over_abandoned: SqlStr,
    pub(super) renew: SqlStr,
    pub(super) complete: SqlStr,
    pub(super) release: SqlStr,
    pub(super) hold: SqlStr,
    pub(super) inspect: SqlStr,
    pub(super) pending: SqlStr,
    pub(super) resolve: SqlStr,
    pub(super) forget: SqlStr,
    pub(super) purge: SqlStr,
    pub(super) bury: SqlStr,
    pub(super) columns: SqlStr,
    pub(super) later_columns: [(&'static str, SqlStr); 2],
    pub(super) exists: SqlStr,
    pub(super) create: SqlStr,
}

impl Sql {
    pub(super) fn new(table: &str) -> Self {
        let quoted = format!("`{table}`");
        let insert_locked = format!(
            "INSERT INTO {quoted} (`key`, fingerprint, token, lease_until, take_over, \
             changed_at) VALUES (?, ?, ?, {NOW_MS} + ?, ?, {NOW_MS})"
        );
        Self {
            table: table.to_owned(),
            // The claim of a new key: a row inserted (1) or the key's row left alone (0). No
            // value can be cut short or refused here (the key and the fingerprint are within
            // their columns), so IGNORE ignores only the duplicate key.
            insert: statement(format!(
                "INSERT IGNORE INTO {quoted} (`key`, fingerprint, token, lease_until, take_over, \
                 changed_at) VALUES (?, ?, ?, {NOW_MS} + ?, ?, {NOW_MS})"
            )),
            // The record a claim found: its token, fingerprint and response, whether it
            // expired, and whether it is pending with its lease lapsed and open to a take-over.
            read: statement(format!(
                "SELECT token, fingerprint, response, COALESCE(expires_at <= {NOW_MS}, 0), \
                 COALESCE(token IS NOT NULL AND take_over AND lease_until <= {NOW_MS}, 0), \
                 tombstone, COALESCE(tombstone_until > {NOW_MS}, 0) \
                 FROM {quoted} WHERE `key` = ?"
            )),
            // The transactional claim's read: the record under its row lock, or an error at
            // once where another transaction holds it.
            read_locked: statement(format!(
                "SELECT token, fingerprint, response, COALESCE(expires_at <= {NOW_MS}, 0), \
                 COALESCE(token IS NOT NULL AND take_over AND lease_until <= {NOW_MS}, 0), \
                 tombstone, COALESCE(tombstone_until > {NOW_MS}, 0) \
                 FROM {quoted} WHERE `key` = ? FOR UPDATE NOWAIT"
            )),
            // The transactional claim's insert: a duplicate is an error, not ignored (another
            // claim committed the key since the read).
            insert_locked: statement(insert_locked.clone()),
            // The same on MariaDB, waiting for no lock: an insert of the key in flight in
            // another transaction is an error at once, not a wait for its end.
            insert_nowait: statement(format!(
                "SET STATEMENT innodb_lock_wait_timeout = 0 FOR {insert_locked}"
            )),
            // Over a completed record past its replay window, and past its tombstone's unless
            // the claim forgets expired operations (the last `?`).
            take_over: statement(format!(
                "UPDATE {quoted} SET fingerprint = ?, token = ?, response = NULL, \
                 expires_at = NULL, changed_at = {NOW_MS}, lease_until = {NOW_MS} + ?, \
                 take_over = ?, tombstone = NULL, tombstone_until = NULL \
                 WHERE `key` = ? AND token IS NULL \
                 AND (response IS NULL OR expires_at <= {NOW_MS}) \
                 AND (? OR tombstone_until IS NULL OR tombstone_until <= {NOW_MS})"
            )),
            take_over_abandoned: statement(format!(
                "UPDATE {quoted} SET token = ?, changed_at = {NOW_MS}, \
                 lease_until = {NOW_MS} + ?, take_over = ? WHERE `key` = ? AND fingerprint = ? \
                 AND token IS NOT NULL AND take_over AND lease_until <= {NOW_MS}"
            )),
            renew: statement(format!(
                "UPDATE {quoted} SET lease_until = {NOW_MS} + ? WHERE `key` = ? AND token = ?"
            )),
            // The response, its retention (twice), its tombstone and how long that is kept
            // (twice), the key and the token.
            complete: statement(format!(
                "UPDATE {quoted} SET response = ?, token = NULL, lease_until = NULL, \
                 changed_at = {NOW_MS}, expires_at = IF(? > 0, {NOW_MS} + ?, NULL), \
                 tombstone = ?, tombstone_until = IF(? > 0, {NOW_MS} + ?, NULL) \
                 WHERE `key` = ? AND token = ?"
            )),
            release: statement(format!(
                "DELETE FROM {quoted} WHERE `key` = ? AND token = ?"
            )),
            // In one transaction with the release: never committed, it only waits for a claim
            // of the key still in flight (its insert holds the key's index record).
            hold: statement(format!(
                "INSERT IGNORE INTO {quoted} (`key`, fingerprint, token, changed_at) \
                 VALUES (?, ?, ?, {NOW_MS})"
            )),
            inspect: statement(format!(
                "SELECT fingerprint, token IS NOT NULL, response, {NOW_MS} - changed_at, \
                 token IS NOT NULL AND COALESCE(lease_until <= {NOW_MS}, 0), tombstone, \
                 COALESCE(expires_at <= {NOW_MS}, 0), COALESCE(tombstone_until > {NOW_MS}, 0), \
                 tombstone_until FROM {quoted} WHERE `key` = ?"
            )),
            pending: statement(format!(
                "SELECT `key` FROM {quoted} WHERE token IS NOT NULL \
                 AND changed_at <= {NOW_MS} - ? ORDER BY `key`"
            )),
            resolve: statement(format!(
                "UPDATE {quoted} SET response = ?, token = NULL, lease_until = NULL, \
                 changed_at = {NOW_MS}, expires_at = IF(? > 0, {NOW_MS} + ?, NULL), \
                 tombstone = ?, tombstone_until = IF(? > 0, {NOW_MS} + ?, NULL) \
                 WHERE `key` = ? AND token IS NOT NULL"
            )),
            forget: statement(format!("DELETE FROM {quoted} WHERE `key` = ?")),
            // One batch of at most `?` expired records, oldest first, by the expiry index.
            // One batch's two steps, each on the first `?` records past their expiry, oldest
            // first by the expiry index (a derived table: MySQL takes no `LIMIT` in an `IN`
            // subquery): those within their tombstone's window lose their response and have
            // their expiry moved to the tombstone's end (where the index finds them again,
            // and not before); then those past their tombstone's window, or with none, are
            // deleted. Each reads at most a batch of the index, whatever mix it holds.
            bury: statement(format!(
                "UPDATE {quoted} JOIN (SELECT `key` FROM (SELECT `key` FROM {quoted} \
                 WHERE expires_at <= {NOW_MS} ORDER BY expires_at LIMIT ?) AS firsts) \
                 AS picked USING (`key`) \
                 SET response = NULL, expires_at = tombstone_until \
                 WHERE expires_at <= {NOW_MS} AND tombstone_until > {NOW_MS}"
            )),
            purge: statement(format!(
                "DELETE {quoted} FROM {quoted} JOIN (SELECT `key` FROM (SELECT `key` \
                 FROM {quoted} WHERE expires_at <= {NOW_MS} ORDER BY expires_at LIMIT ?) \
                 AS firsts) AS picked USING (`key`) \
                 WHERE expires_at <= {NOW_MS} \
                 AND (tombstone_until IS NULL OR tombstone_until <= {NOW_MS})"
            )),
            // The columns of later releases the table has.
            columns: statement(format!(
                "SELECT column_name FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            )),
            later_columns: LATER_COLUMNS.map(|(column, kind)| {
                (
                    column,
                    statement(format!("ALTER TABLE {quoted} ADD COLUMN {column} {kind}")),
                )
            }),
            // Looked up first, so that a start with the table in place runs no DDL (which
            // would wait for the metadata lock of every open transaction on the table).
            exists: statement(format!(
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            )),
            create: statement(schema(table)),
        }
    }
}

/// The columns of later releases, each with its type, as `migrate` adds it to a table made
/// before (the shipped migration `0002_tombstones.sql`).
pub(super) const LATER_COLUMNS: [(&str, &str); 2] = [
    ("tombstone", "LONGBLOB NULL"),
    ("tombstone_until", "BIGINT NULL"),
];

/// The DDL of a new table `table` with every column and its expiry index, safe to run again:
/// the migration files shipped for the default table make the same, the first the table as
/// the first release made it and the second its later columns (what `migrate` adds to a table
/// made before). The key and the fingerprint are bytes, compared exactly (a character column
/// would compare them under a collation, `A` equal to `a`); times are milliseconds since 1970
/// on the server's clock.
pub(super) fn schema(table: &str) -> String {
    let mut columns = String::new();
    for (column, kind) in LATER_COLUMNS {
        columns.push_str(&format!("\x20   {column} {kind},\n"));
    }
    format!(
        "CREATE TABLE IF NOT EXISTS `{table}` (\n\
         \x20   `key` VARBINARY(600) NOT NULL PRIMARY KEY,\n\
         \x20   fingerprint VARBINARY(64) NOT NULL,\n\
         \x20   token BINARY(16) NULL,\n\
         \x20   response LONGBLOB NULL,\n\
         \x20   expires_at BIGINT NULL,\n\
         \x20   changed_at BIGINT NOT NULL,\n\
         \x20   lease_until BIGINT NULL,\n\
         \x20   take_over BOOLEAN NOT NULL DEFAULT FALSE,\n\
         {columns}\
         \x20   INDEX `{table}_expires_at` (expires_at)\n\
         ) ENGINE = InnoDB;\n"
    )
}
