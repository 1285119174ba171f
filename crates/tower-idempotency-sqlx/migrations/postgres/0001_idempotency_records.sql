-- The table of tower-idempotency's PostgreSQL store, as `PostgresStore::migrate` makes it on a
-- new database; `PostgresStore::schema(name)` gives the same for another table name.
-- Run by sqlx::migrate!("migrations/postgres") from a copy of this folder, or any tool.
CREATE TABLE IF NOT EXISTS "idempotency_records" (
    key text PRIMARY KEY,
    fingerprint text NOT NULL,
    token bytea,
    response bytea,
    expires_at timestamptz,
    changed_at timestamptz NOT NULL DEFAULT now(),
    lease_until timestamptz,
    take_over boolean NOT NULL DEFAULT false,
    waited boolean NOT NULL DEFAULT false
);
CREATE INDEX IF NOT EXISTS "idempotency_records_expires_at" ON "idempotency_records" (expires_at)
    WHERE expires_at IS NOT NULL;
