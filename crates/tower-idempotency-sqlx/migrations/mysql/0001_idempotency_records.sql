-- The table of tower-idempotency's MySQL store (MySQL 8, MariaDB 10.5+, InnoDB), as
-- `MySqlStore::migrate` makes it on a new database; `MySqlStore::schema(name)` gives the same
-- for another table name. Run by sqlx::migrate!("migrations/mysql") from a copy of this folder,
-- or any tool.
CREATE TABLE IF NOT EXISTS `idempotency_records` (
    `key` VARBINARY(600) NOT NULL PRIMARY KEY,
    fingerprint VARBINARY(64) NOT NULL,
    token BINARY(16) NULL,
    response LONGBLOB NULL,
    expires_at BIGINT NULL,
    changed_at BIGINT NOT NULL,
    lease_until BIGINT NULL,
    take_over BOOLEAN NOT NULL DEFAULT FALSE,
    INDEX `idempotency_records_expires_at` (expires_at)
) ENGINE = InnoDB;
