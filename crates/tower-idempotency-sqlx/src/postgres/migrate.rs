//! The table's schema and its migration: the table, its columns of later releases, and the
//! expiry index built concurrently.

use super::*;

/// The longest [`PostgresStore::migrate`] waits for a lock it needs to change the table, at a
/// time: claims queue behind a waiting lock request, so no longer than this.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_millis(100);

/// The least [`PostgresStore::migrate`] waits for a connection, whatever the store's timeout.
const MIGRATE_CONNECT_WAIT: Duration = Duration::from_millis(1_500);

/// Attempts of [`PostgresStore::migrate`] at a change whose lock stays held, with
/// [`migrate_pauses`] between them: about half a minute in all.
const MIGRATE_ATTEMPTS: usize = 30;

/// The longest a missing expiry index's build may take, its wait for older transactions
/// included: [`PostgresStore::migrate`] fails past it, saying so.
const INDEX_BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest pause between two attempts of [`PostgresStore::migrate`].
const MAX_MIGRATE_PAUSE: Duration = Duration::from_secs(1);

/// The pauses between the attempts of [`PostgresStore::migrate`]: from the lock wait,
/// doubling, to a second.
fn migrate_pauses() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(MIGRATE_LOCK_WAIT), |pause| {
        Some((*pause * 2).min(MAX_MIGRATE_PAUSE))
    })
}

impl PostgresStore {
    /// Creates the table and its index if they do not exist, and adds the columns of later
    /// releases. Idempotent, and safe to run from several replicas at once.
    ///
    /// Safe to run on every start under load: it looks the table, its columns and its index up
    /// in the catalog first, so a start with nothing to change takes no lock on the table and
    /// waits for no open transaction (the transactional store holds one for every create),
    /// and no claim waits for it. A change waits for its lock a tenth of a second at a time,
    /// so claims queue behind it no longer than that, and is tried again, with pauses growing
    /// to a second, for about half a minute. A missing (or invalid) expiry index is built
    /// with `CREATE INDEX CONCURRENTLY` on a connection of its own, unbounded by the store's
    /// timeout: writers go on while it builds, one replica builds it while the others wait,
    /// and `migrate` returns when it is built (such a build waits for the database's
    /// transactions older than it, at most ten minutes in all, then fails saying so).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the database cannot be reached or refuses, or
    /// [`StoreErrorKind::Timeout`] if a change found its lock held for every attempt.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // Each attempt waits at most `MIGRATE_LOCK_WAIT` for a lock it needs (only a change
        // needs one), so claims queue behind it no longer than that; a change whose lock is
        // held longer (a writing transaction open on the table) is tried again, for as long as
        // `MIGRATE_ATTEMPTS` allow.
        let mut pauses = migrate_pauses();
        let begin = AssertSqlSafe(format!(
            "BEGIN; SET LOCAL lock_timeout = {}",
            MIGRATE_LOCK_WAIT.as_millis()
        ))
        .into_sql_str();
        for attempt in 1..=MIGRATE_ATTEMPTS {
            // A connection that cannot be had fails the migrate: the database is away, and
            // trying again would only hold up the start. Waited for at least
            // `MIGRATE_CONNECT_WAIT`, as making one (TLS, a loaded server) may take longer
            // than a short store timeout.
            let connect_wait = self.base.timeout().max(MIGRATE_CONNECT_WAIT);
            let mut transaction =
                within(connect_wait, begin_on(self.pool(), begin.clone())).await?;
            // `None`: a lock the change needs is held (its `lock_timeout` passed).
            let tried = within(self.base.timeout(), async {
                match sqlx::raw_sql(self.sql.migrate.clone())
                    .execute(&mut *transaction)
                    .await
                {
                    Ok(_) => {}
                    Err(error) if has_code(&error, LOCK_NOT_AVAILABLE) => return Ok(None),
                    Err(error) => return Err(unavailable(error)),
                }
                index_valid(
                    &sqlx::query(self.sql.expiry_index.clone())
                        .fetch_one(&mut *transaction)
                        .await
                        .map_err(unavailable)?,
                )
                .map(Some)
            })
            .await;
            let tried = match tried {
                Ok(Some(indexed)) => {
                    within(self.base.timeout(), async {
                        transaction.commit().await.map_err(unavailable)
                    })
                    .await?;
                    Some(indexed)
                }
                // Ended now, not after the pause (its connection closed, which the server
                // rolls back): its locks (the migrate's advisory lock, a change's table lock)
                // are not held while it waits.
                Ok(None) => {
                    drop(transaction);
                    None
                }
                Err(error) if error.kind() == StoreErrorKind::Timeout => {
                    drop(transaction);
                    None
                }
                Err(error) => return Err(error),
            };
            match tried {
                None if attempt < MIGRATE_ATTEMPTS => {
                    tracing::debug!(attempt, "migrate waits for the table's lock; trying again");
                    tokio::time::sleep(pauses.next().unwrap_or(MAX_MIGRATE_PAUSE)).await;
                }
                None => break,
                Some(true) => return Ok(()),
                Some(false) => return self.build_expiry_index().await,
            }
        }
        Err(StoreError::new(StoreErrorKind::Timeout))
    }

    /// Builds the expiry index if it is missing, or invalid (a build interrupted), with
    /// `CREATE INDEX CONCURRENTLY`: the table's writers go on while it builds, however long
    /// the table. It runs outside any transaction, on a connection of its own, made with the
    /// pool's connect options and closed after (its session settings are its own), one
    /// replica at a time (the others wait for a session lock, tried every so often), within
    /// [`INDEX_BUILD_TIMEOUT`] rather than the store's timeout. Such a build waits for every
    /// transaction of the database that began before it (an idle one left open anywhere
    /// holds it up), so past that time it fails, saying so, and the next `migrate` drops the
    /// invalid index it left and builds it again.
    async fn build_expiry_index(&self) -> Result<(), StoreError> {
        let options = self.pool().connect_options();
        let mut connection = within(self.base.timeout().max(MIGRATE_CONNECT_WAIT), async {
            PgConnection::connect_with(&options)
                .await
                .map_err(unavailable)
        })
        .await?;
        let built = self.build_expiry_index_on(&mut connection).await;
        drop(connection.close().await);
        built
    }

    async fn build_expiry_index_on(&self, connection: &mut PgConnection) -> Result<(), StoreError> {
        let bounded = format!(
            "SET statement_timeout = {}; SET lock_timeout = 0",
            statement_timeout_ms(INDEX_BUILD_TIMEOUT)
        );
        sqlx::raw_sql(AssertSqlSafe(bounded))
            .execute(&mut *connection)
            .await
            .map_err(unavailable)?;
        let expiry_index = self.sql.expiry_index.clone();
        let started = tokio::time::Instant::now();
        let mut pause = MIGRATE_LOCK_WAIT;
        loop {
            let row = sqlx::query(self.sql.lock_for_index.clone())
                .fetch_one(&mut *connection)
                .await
                .map_err(unavailable)?;
            if row.try_get::<bool, _>(0).map_err(corrupt)? {
                break;
            }
            // Another replica builds it: done when it is valid.
            if index_valid(
                &sqlx::query(expiry_index.clone())
                    .fetch_one(&mut *connection)
                    .await
                    .map_err(unavailable)?,
            )? {
                return Ok(());
            }
            if started.elapsed() >= INDEX_BUILD_TIMEOUT {
                return Err(StoreError::with_source(
                    StoreErrorKind::Timeout,
                    "another replica's build of the expiry index did not end in time",
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_MIGRATE_PAUSE);
        }
        let valid = |row: PgRow| index_valid(&row);
        // Built by another replica while this one waited for the lock.
        if valid(
            sqlx::query(expiry_index.clone())
                .fetch_one(&mut *connection)
                .await
                .map_err(unavailable)?,
        )? {
            return Ok(());
        }
        tracing::info!(
            table = %self.sql.table,
            "building the expiry index concurrently; writers go on meanwhile"
        );
        sqlx::raw_sql(self.sql.drop_expiry_index.clone())
            .execute(&mut *connection)
            .await
            .map_err(unavailable)?;
        sqlx::raw_sql(self.sql.build_expiry_index.clone())
            .execute(&mut *connection)
            .await
            .map_err(unavailable)?;
        // One made meanwhile without the lock (a replica of an earlier version) is taken
        // only if it is valid.
        if valid(
            sqlx::query(expiry_index)
                .fetch_one(&mut *connection)
                .await
                .map_err(unavailable)?,
        )? {
            Ok(())
        } else {
            Err(StoreError::with_source(
                StoreErrorKind::Unavailable,
                "the expiry index was left invalid; migrate again to build it anew",
            ))
        }
    }
}

/// Whether the expiry index is there and valid, from the row of `Sql::expiry_index`.
fn index_valid(row: &PgRow) -> Result<bool, StoreError> {
    row.try_get(0).map_err(corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The migration file shipped for the default table is the DDL `schema` gives, and the
    /// one `migrate` makes on a new database (the store's tests run against both).
    #[test]
    fn the_shipped_migration_is_the_schema_of_the_default_table() {
        let shipped = concat!(
            include_str!("../../migrations/postgres/0001_idempotency_records.sql"),
            include_str!("../../migrations/postgres/0002_tombstones.sql")
        );
        let body: String = shipped
            .lines()
            .filter(|line| !line.starts_with("--"))
            .map(|line| format!("{line}\n"))
            .collect();
        assert_eq!(
            body,
            PostgresStore::schema(PostgresStore::DEFAULT_TABLE).unwrap()
        );
        assert_eq!(
            PostgresStore::schema("bad name").unwrap_err().kind(),
            StoreErrorKind::InvalidConfig
        );
    }

    /// The pauses double from the lock wait to a second, and the attempts take about half a
    /// minute in all.
    #[test]
    fn migrate_pauses_double_to_a_second() {
        let pauses: Vec<_> = migrate_pauses().take(MIGRATE_ATTEMPTS).collect();
        let millis: Vec<_> = pauses.iter().take(6).map(Duration::as_millis).collect();
        assert_eq!(millis, [100, 200, 400, 800, 1_000, 1_000]);
        let total: Duration = pauses.iter().sum();
        assert!(
            total > Duration::from_secs(20) && total < Duration::from_secs(40),
            "{total:?}"
        );
    }
}
