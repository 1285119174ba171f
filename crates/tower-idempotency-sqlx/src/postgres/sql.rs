//! The store's SQL, written once per table: every statement a call runs.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// A statement built once: shared by every call (a clone is a reference count, no copy).
fn statement(sql: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(sql)).into_sql_str()
}

/// The statements, built once for the table name.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) table: String,
    pub(super) claim: SqlStr,
    pub(super) take_over: SqlStr,
    pub(super) take_over_abandoned: SqlStr,
    pub(super) renew: SqlStr,
    pub(super) wait_for_claim: SqlStr,
    pub(super) inspect: SqlStr,
    pub(super) claim_locked: SqlStr,
    pub(super) pending: SqlStr,
    pub(super) resolve: SqlStr,
    pub(super) forget: SqlStr,
    pub(super) complete: SqlStr,
    pub(super) complete_in_transaction: SqlStr,
    pub(super) release: SqlStr,
    pub(super) waited: SqlStr,
    pub(super) mark_waited: SqlStr,
    pub(super) announce: SqlStr,
    pub(super) channel: String,
    pub(super) purge: SqlStr,
    pub(super) migrate: SqlStr,
    pub(super) expiry_index: SqlStr,
    pub(super) lock_for_index: SqlStr,
    pub(super) drop_expiry_index: SqlStr,
    pub(super) build_expiry_index: SqlStr,
}

impl Sql {
    pub(super) fn new(table: &str) -> Self {
        let quoted = format!("\"{table}\"");
        // A new lease of $4 milliseconds.
        let lease = "now() + $4::bigint * interval '1 millisecond'";
        let channel = format!("{table}_changed");
        // A statement that changes records returns, for each, whether a request waits on it;
        // the change is then announced by a statement of its own (see `PostgresStore::change`).
        let announced = |statement: String| format!("{statement} RETURNING waited");
        // A claim's write, checked after it was made (after any wait for another
        // transaction's lock on the key): before its deadline on the server's clock, $7 in
        // microseconds since the epoch (the caller's send time moved to the server's clock,
        // plus the timeout), or while that is not known, within $6 milliseconds of the
        // statement's start; else the statement fails (a division by zero, SQLSTATE 22012) and
        // writes nothing. So a claim whose caller gave up (its timeout) cannot write once the
        // settling's wait has passed.
        let in_time = "1 / (clock_timestamp() < COALESCE(to_timestamp($7::bigint::float8 / 1000000), \
             statement_timestamp() + $6::bigint * interval '1 millisecond'))::int = 1";
        // The server's clock, in microseconds since the epoch, as a claim's answer carries it.
        let server_now = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";
        // A take-over, checked the same way after its update.
        let taken_in_time = |update: String| {
            format!("WITH taken AS ({update} RETURNING 1) SELECT 1 FROM taken WHERE {in_time}")
        };
        // The record completed at `clock`: the statement's start in a statement of its own,
        // the moment of the complete inside a transaction that began with the claim (its
        // `now()` is the claim's, so the retention would count from the claim and a create as
        // long as the window would commit a record expired already).
        // Its tombstone ($5) is kept until $6 milliseconds after it completed, if it has one.
        let complete = |clock: &str| {
            format!(
                "UPDATE {quoted} SET response = $3, token = NULL, lease_until = NULL, \
                 changed_at = {clock}, expires_at = CASE \
                 WHEN $4::bigint > 0 THEN {clock} + $4::bigint * interval '1 millisecond' END, \
                 tombstone = $5, tombstone_until = CASE \
                 WHEN $6::bigint > 0 THEN {clock} + $6::bigint * interval '1 millisecond' END \
                 WHERE key = $1 AND token = $2"
            )
        };
        Self {
            table: table.to_owned(),
            channel: channel.clone(),
            claim: statement(format!(
                "WITH inserted AS (\
                 INSERT INTO {quoted} (key, fingerprint, token, lease_until, take_over, waited) \
                 VALUES ($1, $2, $3, {lease}, $5, false) \
                 ON CONFLICT (key) DO NOTHING \
                 RETURNING token, fingerprint, response, false AS expired, false AS lapsed, \
                 NULL::bytea AS tombstone, false AS remembered) \
                 SELECT token, fingerprint, response, expired, lapsed, tombstone, remembered, \
                 {server_now} FROM inserted WHERE {in_time} \
                 UNION ALL \
                 SELECT token, fingerprint, response, COALESCE(expires_at <= now(), false), \
                 COALESCE(lease_until <= now() AND take_over, false), tombstone, \
                 COALESCE(tombstone_until > now(), false), {server_now} \
                 FROM {quoted} WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM inserted)"
            )),
            // Over a completed record past its replay window, and past its tombstone's unless
            // the claim forgets expired operations ($8).
            take_over: statement(taken_in_time(format!(
                "UPDATE {quoted} SET fingerprint = $2, token = $3, response = NULL, expires_at = NULL, \
                 changed_at = now(), lease_until = {lease}, take_over = $5, waited = false, \
                 tombstone = NULL, tombstone_until = NULL \
                 WHERE key = $1 AND token IS NULL AND (response IS NULL OR expires_at <= now()) \
                 AND ($8 OR COALESCE(tombstone_until <= now(), true))"
            ))),
            take_over_abandoned: statement(taken_in_time(format!(
                "UPDATE {quoted} SET token = $3, changed_at = now(), lease_until = {lease}, \
                 take_over = $5 WHERE key = $1 AND fingerprint = $2 AND token IS NOT NULL \
                 AND take_over AND lease_until <= now()"
            ))),
            renew: statement(format!(
                "UPDATE {quoted} SET lease_until = now() + $3::bigint * interval '1 millisecond' \
                 WHERE key = $1 AND token = $2"
            )),
            complete: statement(announced(complete("now()"))),
            // In the claim's own transaction only: the record's version was written by this
            // transaction (a `COMMIT` sent on it since would have ended it).
            complete_in_transaction: statement(format!(
                "{} AND xmin::text::bigint = txid_current() % 4294967296",
                complete("clock_timestamp()")
            )),
            release: statement(announced(format!(
                "DELETE FROM {quoted} WHERE key = $1 AND token = $2"
            ))),
            // A request about to wait for the key: whether it is pending and marked already;
            // if not marked, the mark, so that its change is announced.
            waited: statement(format!(
                "SELECT waited FROM {quoted} WHERE key = $1 AND token IS NOT NULL"
            )),
            mark_waited: statement(format!(
                "UPDATE {quoted} SET waited = true WHERE key = $1 AND token IS NOT NULL"
            )),
            announce: statement(format!("SELECT pg_notify('{channel}', $1)")),
            // In one transaction with the release: never visible, it only waits for a claim
            // of the key still in flight (its insert holds the key's index entry).
            wait_for_claim: statement(format!(
                "INSERT INTO {quoted} (key, fingerprint, token) VALUES ($1, $2, $3) \
                 ON CONFLICT (key) DO NOTHING"
            )),
            // One batch of at most $1 expired records, oldest first, by the expiry index; rows
            // another session holds are skipped (their turn comes). By their row ids, locked
            // as they are picked: a join on the key would scan the whole table for each batch.
            // One batch: the first $1 records past their expiry, oldest first by the expiry
            // index; each one within its tombstone's window loses its response and has its
            // expiry moved to the tombstone's end (where the index finds it again, and not
            // before), every other one is deleted. Its answer: the records it changed. Rows
            // another session holds are skipped (their turn comes). By their row ids, locked
            // as they are picked: a join on the key would scan the whole table for each batch.
            purge: statement(format!(
                "WITH picked AS MATERIALIZED (SELECT ctid, \
                 COALESCE(tombstone_until > now(), false) AS kept FROM {quoted} \
                 WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 \
                 FOR UPDATE SKIP LOCKED), \
                 buried AS (UPDATE {quoted} SET response = NULL, expires_at = tombstone_until \
                 WHERE ctid = ANY(ARRAY(SELECT ctid FROM picked WHERE kept)) RETURNING 1), \
                 deleted AS (DELETE FROM {quoted} \
                 WHERE ctid = ANY(ARRAY(SELECT ctid FROM picked WHERE NOT kept)) RETURNING 1) \
                 SELECT (SELECT count(*) FROM buried) + (SELECT count(*) FROM deleted)"
            )),
            // Every change is made only if the catalog says it is missing, so that a start with
            // nothing to change takes no lock on the table that would wait for a writing
            // transaction and queue every claim behind it; `CREATE INDEX IF NOT EXISTS` alone
            // takes its SHARE lock even when the index exists. What must change waits for its
            // lock no longer than the `lock_timeout` the caller sets (and tries again).
            migrate: statement(format!(
                "SELECT pg_advisory_xact_lock(hashtext('tower-idempotency migrate {table}'));\
                 DO $migrate$ BEGIN \
                 IF to_regclass('{quoted}') IS NULL THEN \
                 CREATE TABLE IF NOT EXISTS {quoted} (\
                 key text PRIMARY KEY, \
                 fingerprint text NOT NULL, \
                 token bytea, \
                 response bytea, \
                 expires_at timestamptz); \
                 END IF; \
                 IF NOT EXISTS (SELECT 1 FROM pg_attribute \
                 WHERE attrelid = to_regclass('{quoted}') AND attname = 'changed_at' \
                 AND NOT attisdropped) THEN \
                 ALTER TABLE {quoted} ADD COLUMN changed_at timestamptz NOT NULL DEFAULT now(); \
                 END IF; \
                 IF NOT EXISTS (SELECT 1 FROM pg_attribute \
                 WHERE attrelid = to_regclass('{quoted}') AND attname = 'lease_until' \
                 AND NOT attisdropped) THEN \
                 ALTER TABLE {quoted} ADD COLUMN lease_until timestamptz; \
                 END IF; \
                 IF NOT EXISTS (SELECT 1 FROM pg_attribute \
                 WHERE attrelid = to_regclass('{quoted}') AND attname = 'take_over' \
                 AND NOT attisdropped) THEN \
                 ALTER TABLE {quoted} ADD COLUMN take_over boolean NOT NULL DEFAULT false; \
                 END IF; \
                 IF NOT EXISTS (SELECT 1 FROM pg_attribute \
                 WHERE attrelid = to_regclass('{quoted}') AND attname = 'waited' \
                 AND NOT attisdropped) THEN \
                 ALTER TABLE {quoted} ADD COLUMN waited boolean NOT NULL DEFAULT false; \
                 END IF; \
                 IF NOT EXISTS (SELECT 1 FROM pg_attribute \
                 WHERE attrelid = to_regclass('{quoted}') AND attname = 'tombstone' \
                 AND NOT attisdropped) THEN \
                 ALTER TABLE {quoted} ADD COLUMN IF NOT EXISTS tombstone bytea; \
                 END IF; \
                 IF NOT EXISTS (SELECT 1 FROM pg_attribute \
                 WHERE attrelid = to_regclass('{quoted}') AND attname = 'tombstone_until' \
                 AND NOT attisdropped) THEN \
                 ALTER TABLE {quoted} ADD COLUMN IF NOT EXISTS tombstone_until timestamptz; \
                 END IF; \
                 END $migrate$;"
            )),
            // The expiry index: whether it is there and valid (a build that was interrupted
            // leaves an invalid one).
            expiry_index: statement(format!(
                "SELECT COALESCE((SELECT indisvalid FROM pg_index \
                 WHERE indexrelid = to_regclass('\"{table}_expires_at\"')), false), \
                 to_regclass('\"{table}_expires_at\"') IS NOT NULL"
            )),
            // The index is built without stopping the table's writers, outside any
            // transaction, on a connection of its own (each statement on its own: a string
            // of several is one transaction): one replica at a time (a session lock), a
            // leftover of an interrupted build dropped first.
            // Tried, not waited for: a statement waiting for the lock would hold a snapshot,
            // which another replica's build waits for (a deadlock).
            lock_for_index: statement(format!(
                "SELECT pg_try_advisory_lock(hashtext('tower-idempotency index {table}'))"
            )),
            drop_expiry_index: statement(format!(
                "DROP INDEX CONCURRENTLY IF EXISTS \"{table}_expires_at\""
            )),
            build_expiry_index: statement(format!(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{table}_expires_at\" ON {quoted} \
                 (expires_at) WHERE expires_at IS NOT NULL"
            )),
            inspect: statement(format!(
                "SELECT fingerprint, token IS NOT NULL, response, \
                 (extract(epoch FROM now() - changed_at) * 1000)::bigint, \
                 token IS NOT NULL AND COALESCE(lease_until <= now(), false), tombstone, \
                 COALESCE(expires_at <= now(), false), COALESCE(tombstone_until > now(), false), \
                 (extract(epoch FROM tombstone_until) * 1000)::bigint \
                 FROM {quoted} WHERE key = $1"
            )),
            // The claim of the transactional mode, in the claim's transaction: first the key's
            // advisory lock, tried (a transaction holding it is creating the key), then, if
            // this transaction got it, the claim; whether or not, the record as committed.
            // Always one row: whether the lock is this transaction's, then the claim's columns
            // (all NULL when there is no record).
            claim_locked: statement(format!(
                "WITH locked AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($6) AS locked), \
                 inserted AS (\
                 INSERT INTO {quoted} (key, fingerprint, token, lease_until, take_over, waited) \
                 SELECT $1, $2, $3, {lease}, $5, false FROM locked WHERE locked \
                 ON CONFLICT (key) DO NOTHING \
                 RETURNING token, fingerprint, response, false AS expired, false AS lapsed, \
                 NULL::bytea AS tombstone, false AS remembered), \
                 found AS (\
                 SELECT token, fingerprint, response, expired, lapsed, tombstone, remembered \
                 FROM inserted \
                 UNION ALL \
                 SELECT token, fingerprint, response, COALESCE(expires_at <= now(), false), \
                 COALESCE(lease_until <= now() AND take_over, false), tombstone, \
                 COALESCE(tombstone_until > now(), false) \
                 FROM {quoted} WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM inserted)) \
                 SELECT locked.locked, found.token, found.fingerprint, found.response, \
                 found.expired, found.lapsed, found.tombstone, found.remembered \
                 FROM locked LEFT JOIN found ON true"
            )),
            pending: statement(format!(
                "SELECT key FROM {quoted} WHERE token IS NOT NULL \
                 AND changed_at <= now() - $1::bigint * interval '1 millisecond' ORDER BY key"
            )),
            resolve: statement(announced(format!(
                "UPDATE {quoted} SET response = $2, token = NULL, lease_until = NULL, changed_at = now(), \
                 expires_at = CASE WHEN $3::bigint > 0 \
                 THEN now() + $3::bigint * interval '1 millisecond' END, tombstone = $4, \
                 tombstone_until = CASE WHEN $5::bigint > 0 \
                 THEN now() + $5::bigint * interval '1 millisecond' END \
                 WHERE key = $1 AND token IS NOT NULL"
            ))),
            forget: statement(announced(format!("DELETE FROM {quoted} WHERE key = $1"))),
        }
    }
}

/// The DDL of a new table `table`, its expiry index and its columns of later releases, as
/// [`migrate`] makes them: the same as the migration files shipped for the default table, one
/// after the other (less their comments).
///
/// [`migrate`]: super::PostgresStore::migrate
pub(super) fn schema(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (\n\
         \x20   key text PRIMARY KEY,\n\
         \x20   fingerprint text NOT NULL,\n\
         \x20   token bytea,\n\
         \x20   response bytea,\n\
         \x20   expires_at timestamptz,\n\
         \x20   changed_at timestamptz NOT NULL DEFAULT now(),\n\
         \x20   lease_until timestamptz,\n\
         \x20   take_over boolean NOT NULL DEFAULT false,\n\
         \x20   waited boolean NOT NULL DEFAULT false\n\
         );\n\
         CREATE INDEX IF NOT EXISTS \"{table}_expires_at\" ON \"{table}\" (expires_at)\n\
         \x20   WHERE expires_at IS NOT NULL;\n\
         ALTER TABLE \"{table}\" ADD COLUMN IF NOT EXISTS tombstone bytea;\n\
         ALTER TABLE \"{table}\" ADD COLUMN IF NOT EXISTS tombstone_until timestamptz;\n"
    )
}
