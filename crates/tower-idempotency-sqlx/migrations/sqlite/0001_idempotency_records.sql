-- The table of tower-idempotency's SQLite store, as `SqliteStore::open` and
-- `SqliteStore::migrate` make it (`SqliteStore::SCHEMA` is this file).
-- Run by sqlx::migrate!("migrations/sqlite") from a copy of this folder, or any tool.
-- Times are milliseconds since 1970; token and response are blobs the store writes.
CREATE TABLE IF NOT EXISTS idempotency_records (
    key TEXT PRIMARY KEY NOT NULL,
    fingerprint TEXT NOT NULL,
    token BLOB,
    response BLOB,
    lease_until INTEGER,
    take_over INTEGER NOT NULL DEFAULT 0,
    changed_at INTEGER NOT NULL,
    expires_at INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at
    ON idempotency_records (expires_at) WHERE expires_at IS NOT NULL;
