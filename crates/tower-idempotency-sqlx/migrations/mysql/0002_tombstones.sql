-- The columns of tombstones, added to the table of 0001 (`MySqlStore::migrate` adds each one
-- that is missing). A completed record keeps its tombstone (when it completed, its status and
-- `Location`) beside its response, and `tombstone_until` when the tombstone's window ends
-- (milliseconds since 1970 on the server's clock); once its replay window passed, the purge
-- drops the response and keeps the tombstone until then.
ALTER TABLE `idempotency_records` ADD COLUMN tombstone LONGBLOB NULL;
ALTER TABLE `idempotency_records` ADD COLUMN tombstone_until BIGINT NULL;
