//! What the two worker examples share: the command line, the store, the effect (a row of
//! `labels_by_message`, or a printed line), and the handling of one message through
//! [`Idempotent`]: acknowledged once its value is stored, delivered again while another
//! attempt holds its key.
#![allow(dead_code)]

use std::time::Duration;

use tower_idempotency::idempotent::{self, Attempt, Idempotent, Ran, RunError};
use tower_idempotency::store::DynStore;

use crate::common;

/// One message: its id (the producer's, the key unless `--key-from-header`) and its parcel.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub id: String,
    pub parcel_id: String,
}

/// The command line of a worker.
pub struct Options {
    pub broker: String,
    pub queue: String,
    pub store: String,
    pub transactional: bool,
    /// Each message's work takes 0, 1 or 2 times this, by its id: some outlast an ack wait.
    pub work_delay: Duration,
    pub key_from_header: bool,
    pub publish: Option<usize>,
    pub duplicate_every: usize,
    pub id_prefix: String,
    /// This worker's name, in the effect table's `worker` column.
    pub worker: String,
    pub lease: Duration,
    pub prefetch: u16,
    /// NATS: how long JetStream waits for an ack before it delivers a message again.
    pub ack_wait: Duration,
    /// RabbitMQ: close the channel, its deliveries unacknowledged, after this many.
    pub close_channel_every: Option<u64>,
    /// Print what the queue still holds and exit.
    pub report: bool,
    /// Delete the queue (the stream) and exit.
    pub delete: bool,
}

impl Options {
    /// The command line, or exit 2 with `usage`.
    pub fn from_args(usage: &str, default_broker: &str) -> Self {
        Self::parse(std::env::args().skip(1), default_broker).unwrap_or_else(|message| {
            eprintln!("{message}\n{usage}");
            std::process::exit(2);
        })
    }

    fn parse(mut args: impl Iterator<Item = String>, default_broker: &str) -> Result<Self, String> {
        let mut options = Self {
            broker: default_broker.to_owned(),
            queue: "labels".to_owned(),
            store: "memory".to_owned(),
            transactional: false,
            work_delay: Duration::ZERO,
            key_from_header: false,
            publish: None,
            duplicate_every: 0,
            id_prefix: "msg".to_owned(),
            worker: format!("worker-{}", std::process::id()),
            lease: Duration::from_secs(5),
            prefetch: 16,
            ack_wait: Duration::from_secs(30),
            close_channel_every: None,
            report: false,
            delete: false,
        };
        while let Some(flag) = args.next() {
            match flag.as_str() {
                "--transactional" => options.transactional = true,
                "--key-from-header" => options.key_from_header = true,
                "--report" => options.report = true,
                "--delete" => options.delete = true,
                _ => {
                    let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
                    let number = || {
                        value
                            .parse::<u64>()
                            .map_err(|_| format!("{flag} {value}: not a number"))
                    };
                    match flag.as_str() {
                        "--broker" => options.broker = value,
                        "--queue" => options.queue = value,
                        "--store" => options.store = value,
                        "--work-delay-ms" => options.work_delay = Duration::from_millis(number()?),
                        "--publish" => options.publish = Some(number()? as usize),
                        "--duplicate-every" => options.duplicate_every = number()? as usize,
                        "--id-prefix" => options.id_prefix = value,
                        "--worker" => options.worker = value,
                        "--lease-ms" => options.lease = Duration::from_millis(number()?),
                        "--prefetch" => {
                            options.prefetch = u16::try_from(number()?)
                                .map_err(|_| "--prefetch: at most 65535")?;
                        }
                        "--ack-wait-ms" => options.ack_wait = Duration::from_millis(number()?),
                        "--close-channel-every" => {
                            options.close_channel_every = Some(number()?.max(1))
                        }
                        _ => return Err(format!("unknown flag {flag}")),
                    }
                }
            }
        }
        Ok(options)
    }

    /// The messages `--publish N --duplicate-every K --id-prefix P` sends, in order: ids `P-0`
    /// … `P-(N-1)`, every K-th sent twice.
    pub fn messages(&self) -> Vec<Message> {
        let mut messages = Vec::new();
        for i in 0..self.publish.unwrap_or(0) {
            let copies = if self.duplicate_every > 0 && (i + 1).is_multiple_of(self.duplicate_every)
            {
                2
            } else {
                1
            };
            for _ in 0..copies {
                messages.push(Message {
                    id: format!("{}-{i}", self.id_prefix),
                    parcel_id: format!("parcel-{i}"),
                });
            }
        }
        messages
    }
}

/// Logs to stderr (stdout carries the printed effects): `info` unless `RUST_LOG` says
/// otherwise.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_target(false)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
}

/// What becomes of a delivery.
#[derive(Debug)]
pub enum Verdict {
    /// Acknowledge it: its value is stored (done now or replayed).
    Ack,
    /// Deliver it again later: another attempt holds its key, or the store did not answer.
    Retry,
    /// Drop it: it can never succeed (not a message, or its key used by another message).
    Reject(String),
}

/// Where the effect of a message goes: a row of `labels_by_message` in the store's database,
/// or, on memory and Redis, a line `effect LABEL MESSAGE WORKER` on stdout.
pub enum Effects {
    Printed,
    #[cfg(feature = "postgres")]
    Postgres(tower_idempotency::store::postgres::sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(tower_idempotency::store::mysql::sqlx::MySqlPool),
    #[cfg(feature = "sqlite")]
    Sqlite(tower_idempotency::store::sqlite::sqlx::SqlitePool),
}

/// The effect table, with no unique constraint on `message_id`: a second effect shows.
const TABLE: &str = "labels_by_message";

impl Effects {
    /// The effects of a worker on `store`, the table made if missing.
    async fn open(store: &str) -> Result<Self, String> {
        #[cfg_attr(
            not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
            allow(unused_variables)
        )]
        let error = |e: &dyn std::fmt::Display| format!("{e}");
        if store.starts_with("postgres://") || store.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            {
                use tower_idempotency::store::postgres::sqlx;
                let pool = sqlx::PgPool::connect(store).await.map_err(|e| error(&e))?;
                // Under a lock, so that workers starting together create it once.
                sqlx::raw_sql(
                    "BEGIN; \
                     SELECT pg_advisory_xact_lock(hashtext('tower-idempotency labels_by_message')); \
                     CREATE TABLE IF NOT EXISTS labels_by_message (\
                     label_id text PRIMARY KEY, message_id text NOT NULL, worker text NOT NULL); \
                     COMMIT",
                )
                .execute(&pool)
                .await
                .map_err(|e| error(&e))?;
                return Ok(Self::Postgres(pool));
            }
            #[cfg(not(feature = "postgres"))]
            return Err("build with --features postgres".to_owned());
        }
        if store.starts_with("mysql://") || store.starts_with("mariadb://") {
            #[cfg(feature = "mysql")]
            {
                use tower_idempotency::store::mysql::sqlx;
                let pool = sqlx::MySqlPool::connect(store)
                    .await
                    .map_err(|e| error(&e))?;
                sqlx::raw_sql(
                    "CREATE TABLE IF NOT EXISTS labels_by_message (\
                     label_id VARCHAR(200) PRIMARY KEY, message_id VARCHAR(255) NOT NULL, \
                     worker VARCHAR(100) NOT NULL) ENGINE = InnoDB",
                )
                .execute(&pool)
                .await
                .map_err(|e| error(&e))?;
                return Ok(Self::MySql(pool));
            }
            #[cfg(not(feature = "mysql"))]
            return Err("build with --features mysql".to_owned());
        }
        if let Some(path) = store.strip_prefix("sqlite://") {
            #[cfg(feature = "sqlite")]
            {
                use tower_idempotency::store::sqlite::sqlx;
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(true)
                    .busy_timeout(Duration::from_secs(10));
                let pool = sqlx::SqlitePool::connect_with(options)
                    .await
                    .map_err(|e| error(&e))?;
                sqlx::raw_sql(
                    "CREATE TABLE IF NOT EXISTS labels_by_message (\
                     label_id TEXT PRIMARY KEY, message_id TEXT NOT NULL, worker TEXT NOT NULL)",
                )
                .execute(&pool)
                .await
                .map_err(|e| error(&e))?;
                return Ok(Self::Sqlite(pool));
            }
            #[cfg(not(feature = "sqlite"))]
            return Err(format!("{path}: build with --features sqlite"));
        }
        Ok(Self::Printed)
    }

    /// Records the effect of `message_id`: in the claim's transaction if the store gave one.
    async fn apply(
        &self,
        attempt: &Attempt,
        label_id: &str,
        message_id: &str,
        worker: &str,
    ) -> Result<(), String> {
        let _ = attempt;
        match self {
            Self::Printed => {
                println!("effect {label_id} {message_id} {worker}");
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                use tower_idempotency::store::postgres::sqlx;
                let insert = sqlx::query("INSERT INTO labels_by_message (label_id, message_id, worker) VALUES ($1, $2, $3)")
                    .bind(label_id)
                    .bind(message_id)
                    .bind(worker);
                let inserted = match attempt.get::<tower_idempotency::store::PgTransaction>() {
                    Some(transaction) => {
                        let mut connection =
                            transaction.acquire().await.map_err(|e| e.to_string())?;
                        insert.execute(&mut *connection).await
                    }
                    None => insert.execute(pool).await,
                };
                inserted.map(drop).map_err(|e| e.to_string())
            }
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => {
                use tower_idempotency::store::mysql::sqlx;
                let insert = sqlx::query(
                    "INSERT INTO labels_by_message (label_id, message_id, worker) VALUES (?, ?, ?)",
                )
                .bind(label_id)
                .bind(message_id)
                .bind(worker);
                let inserted = match attempt.get::<tower_idempotency::store::MySqlTransaction>() {
                    Some(transaction) => {
                        let mut connection =
                            transaction.acquire().await.map_err(|e| e.to_string())?;
                        insert.execute(&mut *connection).await
                    }
                    None => insert.execute(pool).await,
                };
                inserted.map(drop).map_err(|e| e.to_string())
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(pool) => {
                use tower_idempotency::store::sqlite::sqlx;
                sqlx::query(
                    "INSERT INTO labels_by_message (label_id, message_id, worker) VALUES (?, ?, ?)",
                )
                .bind(label_id)
                .bind(message_id)
                .bind(worker)
                .execute(pool)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
            }
        }
    }
}

/// A worker: its runs, its effects, its name.
pub struct Worker {
    labels: Idempotent<DynStore>,
    effects: Effects,
    name: String,
    work_delay: Duration,
    key_from_header: bool,
    /// Label ids unique across workers, runs and restarts.
    labels_ids: common::Ids,
}

impl Worker {
    /// The worker `options` describe, its store and effect table opened.
    pub async fn open(options: &Options) -> Result<Self, String> {
        let mut store_options = common::Options::parse(
            std::iter::empty(),
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            "",
            |_, _| Ok(false),
        )?;
        store_options.store = options.store.clone();
        let store = if options.transactional {
            common::open_transactional_store(&store_options).await?
        } else {
            common::open_store(&store_options).await?
        };
        // Every worker of the queue takes over the key of one that crashed mid-work, once its
        // lease lapsed.
        let labels = Idempotent::new(store)
            .scope(TABLE)
            .lease(options.lease)
            .take_over_abandoned();
        Ok(Self {
            labels,
            effects: Effects::open(&options.store).await?,
            name: options.worker.clone(),
            work_delay: options.work_delay,
            key_from_header: options.key_from_header,
            labels_ids: common::Ids::new("label"),
        })
    }

    /// Handles one delivery: `body`, the message id header if the broker carried one, and
    /// whether the broker delivered it before.
    pub async fn handle(
        &self,
        body: &[u8],
        header_key: Option<&str>,
        redelivered: bool,
    ) -> Verdict {
        let message: Message = match serde_json::from_slice(body) {
            Ok(message) => message,
            Err(error) => return Verdict::Reject(format!("not a message: {error}")),
        };
        tracing::info!(id = %message.id, redelivered, "received");
        let key = if self.key_from_header {
            match header_key {
                Some(key) => key,
                None => return Verdict::Reject("no message id header".to_owned()),
            }
        } else {
            message.id.as_str()
        };
        let fingerprint = match idempotent::fingerprint(&message) {
            Ok(fingerprint) => fingerprint,
            Err(error) => return Verdict::Reject(error.to_string()),
        };
        let delay = self.work_delay * spread(&message.id);
        let id = message.id.as_str();
        let ran = self
            .labels
            .run(key, fingerprint, |attempt| async move {
                tokio::time::sleep(delay).await;
                let label_id = self.labels_ids.next();
                self.effects
                    .apply(&attempt, &label_id, id, &self.name)
                    .await?;
                Ok::<_, String>(label_id)
            })
            .await;
        match ran {
            Ok(Ran::Done(label_id)) => {
                tracing::info!(id = %message.id, %label_id, "done");
                Verdict::Ack
            }
            Ok(Ran::Replayed(label_id)) => {
                tracing::info!(id = %message.id, %label_id, "replayed");
                Verdict::Ack
            }
            // Done, its value not stored: delivering it again would run it again once its
            // lease lapsed.
            Ok(Ran::Unrecorded(label_id)) => {
                tracing::warn!(id = %message.id, %label_id, "done, unrecorded");
                Verdict::Ack
            }
            // The key held by another attempt, or the store away: later. A failed effect
            // keeps its key until its lease lapses, then a delivery takes it over.
            Err(error) if error.is_transient() || matches!(error, RunError::Failed(_)) => {
                tracing::info!(id = %message.id, %error, "later");
                Verdict::Retry
            }
            Err(error) => {
                tracing::error!(id = %message.id, %error, "dropped");
                Verdict::Reject(error.to_string())
            }
        }
    }
}

/// 0, 1 or 2, by `id`: how many work delays its work takes.
fn spread(id: &str) -> u32 {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % 3) as u32
}

/// Resolves on `SIGTERM` or Ctrl-C.
pub async fn terminated() {
    common::terminated().await;
}
