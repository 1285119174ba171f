-- The columns of tombstones, added to the table of 0001 (`PostgresStore::migrate` adds each
-- one that is missing). A completed record keeps its tombstone (when it completed, its status
-- and `Location`) beside its response, and `tombstone_until` when the tombstone's window ends;
-- once its replay window passed, the purge drops the response and keeps the tombstone until
-- then.
ALTER TABLE "idempotency_records" ADD COLUMN IF NOT EXISTS tombstone bytea;
ALTER TABLE "idempotency_records" ADD COLUMN IF NOT EXISTS tombstone_until timestamptz;
