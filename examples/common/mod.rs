//! What the example servers share: the command line, the store named by `--store`, one log
//! line per request, ids unique across processes, and serving.
#![allow(dead_code)]

use std::future::IntoFuture as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tower_idempotency::MemoryStore;
use tower_idempotency::layer::Drain;
use tower_idempotency::operation::IDEMPOTENCY_KEY;
use tower_idempotency::reply::Outcome;
use tower_idempotency::store::DynStore;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use tower_idempotency::store::Purge;

/// The flags every example server takes; `extra` gets the others, with their value.
pub struct Options {
    pub addr: SocketAddr,
    pub create_delay: Duration,
    pub store: String,
    /// `--pending-wait-ms N`: how long a retry waits for a first attempt still running; 0
    /// (the default) answers `409` at once, as the contract says.
    pub pending_wait: Option<Duration>,
    /// `--retention-s N`: how long a completed key replays; 0 keeps every key for good.
    /// Default 86400, a day, the stores' own default.
    pub retention: Option<Duration>,
    /// `--tombstone-s N`: how long a completed key is remembered past its replay window,
    /// answered "expired" rather than created again; 0 remembers none. Default 604800, a
    /// week, the stores' own default (kept by the memory and SQL stores; Redis next).
    pub tombstones: Duration,
    /// `--purge-every-s N`: how often a durable store (PostgreSQL, SQLite) deletes its
    /// expired records; 0 never. Default 3600, an hour.
    pub purge_every: Option<Duration>,
    /// `--max-records N`: the most records the memory store holds; 0 holds every record.
    /// Default 1,000,000, the store's own default.
    pub max_records: Option<usize>,
    /// `--metrics HOST:PORT`: serve the layers' metrics there, at `/metrics`, in Prometheus
    /// text (built with the feature `metrics`).
    pub metrics: Option<SocketAddr>,
    /// `--drain-s N`: on `SIGTERM` or Ctrl-C, how long the creates in flight have to complete
    /// while the server stops accepting and refuses new claims. Default 30.
    pub drain: Duration,
    /// `--wait-for-replicas N`: the replicas each Redis write waits for (0: none). Default:
    /// one where the record's primary has any, as the store finds.
    pub wait_for_replicas: Option<u32>,
}

impl Options {
    /// Parses the command line; `extra(flag, value)` takes the server's own flags and says
    /// whether it knew the flag.
    pub fn parse(
        mut args: impl Iterator<Item = String>,
        addr: SocketAddr,
        usage: &str,
        mut extra: impl FnMut(&str, &str) -> Result<bool, String>,
    ) -> Result<Self, String> {
        let mut options = Self {
            addr,
            create_delay: Duration::ZERO,
            store: "memory".to_owned(),
            pending_wait: None,
            retention: Some(tower_idempotency::store::DEFAULT_RETENTION),
            tombstones: tower_idempotency::store::DEFAULT_TOMBSTONES,
            purge_every: Some(Duration::from_secs(3600)),
            max_records: Some(tower_idempotency::store::DEFAULT_MAX_RECORDS),
            metrics: None,
            drain: Duration::from_secs(30),
            wait_for_replicas: None,
        };
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                return Err(usage.to_owned());
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{usage}"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}\n{usage}");
            match flag.as_str() {
                "--addr" => options.addr = value.parse().map_err(|e| bad(&e))?,
                "--create-delay-ms" => {
                    options.create_delay =
                        Duration::from_millis(value.parse().map_err(|e| bad(&e))?)
                }
                "--store" => options.store = value,
                "--pending-wait-ms" => {
                    let millis: u64 = value.parse().map_err(|e| bad(&e))?;
                    options.pending_wait = (millis > 0).then(|| Duration::from_millis(millis));
                }
                "--retention-s" => {
                    let seconds: u64 = value.parse().map_err(|e| bad(&e))?;
                    options.retention = (seconds > 0).then(|| Duration::from_secs(seconds));
                }
                "--tombstone-s" => {
                    options.tombstones = Duration::from_secs(value.parse().map_err(|e| bad(&e))?);
                }
                "--purge-every-s" => {
                    let seconds: u64 = value.parse().map_err(|e| bad(&e))?;
                    options.purge_every = (seconds > 0).then(|| Duration::from_secs(seconds));
                }
                "--max-records" => {
                    let records: usize = value.parse().map_err(|e| bad(&e))?;
                    options.max_records = (records > 0).then_some(records);
                }
                "--metrics" => options.metrics = Some(value.parse().map_err(|e| bad(&e))?),
                "--wait-for-replicas" => {
                    options.wait_for_replicas = Some(value.parse().map_err(|e| bad(&e))?)
                }
                "--drain-s" => {
                    options.drain = Duration::from_secs(value.parse().map_err(|e| bad(&e))?)
                }
                _ => {
                    if !extra(&flag, &value).map_err(|e| bad(&e))? {
                        return Err(format!("unknown flag {flag}\n{usage}"));
                    }
                }
            }
        }
        Ok(options)
    }
}

/// `layer` with its metrics `label` (with the feature `metrics`; without it, as it is).
pub fn labelled<St, O, A, K>(
    layer: tower_idempotency::IdempotencyLayer<St, O, A, K>,
    label: &'static str,
) -> tower_idempotency::IdempotencyLayer<St, O, A, K> {
    #[cfg(feature = "metrics")]
    return layer.metrics_label(label);
    #[cfg(not(feature = "metrics"))]
    {
        let _ = label;
        layer
    }
}

/// Serves the layers' metrics on `--metrics`'s address, if given: Prometheus text at
/// `/metrics` (at any path but `/health`), from the exporter installed for the process.
fn serve_metrics(options: &Options) {
    let Some(addr) = options.metrics else {
        return;
    };
    #[cfg(feature = "metrics")]
    {
        use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
        use tower_idempotency::metrics::STORE_CALL_SECONDS;
        // Store call times as histograms (buckets from 50 µs to 2.5 s), which add up across
        // replicas, rather than the exporter's default summaries.
        const BUCKETS: [f64; 11] = [
            0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25, 1.0, 2.5,
        ];
        let installed = PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets_for_metric(Matcher::Full(STORE_CALL_SECONDS.to_owned()), &BUCKETS)
            .and_then(PrometheusBuilder::install);
        if let Err(error) = installed {
            eprintln!("--metrics {addr}: {error}");
            std::process::exit(1);
        }
        tracing::info!("metrics on http://{addr}/metrics");
    }
    #[cfg(not(feature = "metrics"))]
    {
        eprintln!(
            "--metrics {addr}: built without the feature `metrics`; \
             run with `cargo run --features metrics --example …`"
        );
        std::process::exit(2);
    }
}

/// `layer` with the `--pending-wait-ms` setting, if one was given, and the process's
/// [`drain`].
pub fn with_wait_and_drain<St, O, A, K>(
    layer: tower_idempotency::IdempotencyLayer<St, O, A, K>,
    wait: Option<Duration>,
) -> tower_idempotency::IdempotencyLayer<St, O, A, K> {
    let layer = layer.drain(drain());
    match wait {
        Some(wait) => layer.pending_wait(wait),
        None => layer,
    }
}

/// The drain of every layer of the process: closed on `SIGTERM` or Ctrl-C.
pub fn drain() -> &'static Drain {
    static DRAIN: std::sync::OnceLock<Drain> = std::sync::OnceLock::new();
    DRAIN.get_or_init(Drain::new)
}

/// Ends on `SIGTERM` or Ctrl-C, and closes the [`drain`]: no new claims from then on.
pub async fn terminated() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    let _ = SIGNALLED.set(tokio::time::Instant::now());
    tracing::info!("shutting down: no new claims; creates in flight run to their complete");
    drain().close();
}

/// When [`terminated`] was signalled.
static SIGNALLED: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();

/// Runs `serve` (a server whose graceful shutdown starts on [`terminated`]) until it ended
/// and every create in flight completed, or `deadline` after the signal, whichever is first;
/// then returns, so that the process exits 0.
pub async fn drained<E: std::fmt::Display>(
    serve: impl std::future::Future<Output = Result<(), E>>,
    deadline: Duration,
) {
    let drain = drain();
    let give_up = async {
        drain.closed().await;
        tokio::time::sleep(deadline).await;
    };
    tokio::select! {
        served = serve => {
            if let Err(error) = served {
                eprintln!("server failed: {error}");
                std::process::exit(1);
            }
        }
        () = give_up => {}
    }
    // Decisions whose clients left, and lost store answers being settled, run on as tasks
    // of their own: wait for them too, within what is left of the deadline.
    let since = SIGNALLED.get().map_or(Duration::ZERO, |at| at.elapsed());
    match drain.shutdown(deadline.saturating_sub(since)).await {
        Ok(()) => tracing::info!("drained: every create in flight completed"),
        Err(unfinished) => tracing::warn!("{unfinished}"),
    }
}

/// `store` keeping completed keys for `retention`, or for good (`None`): every store (the
/// memory store's builder) has both settings.
macro_rules! retained {
    ($store:expr, $retention:expr) => {
        match $retention {
            Some(retention) => $store.retention(retention),
            None => $store.keep_forever(),
        }
    };
}

/// Starts the purger of a durable store with `--purge-every-s`, unless it is 0, and keeps it
/// for the life of the process.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn keep_purging(
    options: &Options,
    start: impl FnOnce()
        -> Result<tower_idempotency::store::Purger, tower_idempotency::store::StoreError>,
) {
    static PURGERS: std::sync::Mutex<Vec<tower_idempotency::store::Purger>> =
        std::sync::Mutex::new(Vec::new());
    if options.purge_every.is_some() {
        match start() {
            Ok(purger) => PURGERS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(purger),
            Err(error) => tracing::error!("the store's expired records are not purged: {error:#}"),
        }
    }
}

/// The purge interval `--purge-every-s` gave (only read when it is set).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn every(options: &Options) -> Duration {
    options.purge_every.unwrap_or(Duration::MAX)
}

/// The database of a transactional store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Database {
    Postgres,
    MySql,
}

impl Database {
    /// The database `url` names: MySQL for `mysql://…` and `mariadb://…`, else PostgreSQL.
    pub fn of(url: &str) -> Self {
        if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            Self::MySql
        } else {
            Self::Postgres
        }
    }
}

/// The transactional store on `url` (`postgres://…` or `mysql://…`), its table migrated, and
/// the table `labels` the label server's creates insert into, created if missing.
pub async fn open_transactional_store(options: &Options) -> Result<DynStore, String> {
    let url = options.store.as_str();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return open_transactional_postgres(options).await;
    }
    if Database::of(url) == Database::MySql {
        return open_transactional_mysql(options).await;
    }
    Err(format!(
        "--transactional needs --store postgres://… or mysql://…, not {url}"
    ))
}

async fn open_transactional_postgres(options: &Options) -> Result<DynStore, String> {
    let (url, retention) = (options.store.as_str(), options.retention);
    #[cfg(feature = "postgres")]
    {
        use tower_idempotency::store::{PostgresStore, TransactionalPostgresStore};
        let store = PostgresStore::connect(url)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let store = retained!(store, retention).tombstones(options.tombstones);
        store.migrate().await.map_err(|e| format!("{e:#}"))?;
        // Under a lock, so that replicas starting together create it once.
        tower_idempotency::store::postgres::sqlx::raw_sql(
            "BEGIN; \
             SELECT pg_advisory_xact_lock(hashtext('tower-idempotency example labels')); \
             CREATE TABLE IF NOT EXISTS labels (\
             label_id text PRIMARY KEY, \
             request_id text NOT NULL, \
             parcel_id text NOT NULL, \
             created_at timestamptz NOT NULL DEFAULT now()); \
             COMMIT",
        )
        .execute(store.pool())
        .await
        .map_err(|e| format!("{e:#}"))?;
        keep_purging(options, || store.purge_every(every(options)));
        Ok(DynStore::new(TransactionalPostgresStore::new(store)))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (url, retention);
        Err("build with --features postgres".to_owned())
    }
}

async fn open_transactional_mysql(options: &Options) -> Result<DynStore, String> {
    let (url, retention) = (options.store.as_str(), options.retention);
    #[cfg(feature = "mysql")]
    {
        use tower_idempotency::store::mysql::sqlx::Executor as _;
        use tower_idempotency::store::{MySqlStore, TransactionalMySqlStore};
        let store = MySqlStore::connect(url)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let store = retained!(store, retention).tombstones(options.tombstones);
        store.migrate().await.map_err(|e| format!("{e:#}"))?;
        store
            .pool()
            .execute(
                "CREATE TABLE IF NOT EXISTS labels (\
                 label_id VARCHAR(200) PRIMARY KEY, \
                 request_id VARCHAR(200) NOT NULL, \
                 parcel_id VARCHAR(200) NOT NULL, \
                 created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE = InnoDB",
            )
            .await
            .map_err(|e| format!("{e:#}"))?;
        keep_purging(options, || store.purge_every(every(options)));
        Ok(DynStore::new(TransactionalMySqlStore::new(store)))
    }
    #[cfg(not(feature = "mysql"))]
    {
        let _ = (url, retention);
        Err("build with --features mysql".to_owned())
    }
}

/// What the store does beside its URL, for the start line: the replica wait of a Redis store.
static STORE_NOTE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `store` waiting for the replicas `--wait-for-replicas` asks for, its wait noted for the
/// start line.
#[cfg(feature = "redis")]
fn replicas_waited(
    store: tower_idempotency::store::RedisStore,
    options: &Options,
) -> tower_idempotency::store::RedisStore {
    let store = match options.wait_for_replicas {
        Some(replicas) => store.wait_for_replicas(replicas, Duration::from_secs(1)),
        None => store,
    };
    let _ = STORE_NOTE.set(format!("replica wait: {}", store.replica_wait()));
    store
}

/// The store's note for the start line, `; ` and the note, or nothing.
pub fn store_note() -> String {
    STORE_NOTE
        .get()
        .map_or_else(String::new, |note| format!("; {note}"))
}

/// The store `url` names: `memory`, `redis://…`, `redis-cluster://HOST:PORT[,HOST:PORT…]` (seed
/// nodes of a Redis Cluster), `postgres://…`, `mysql://…` or `sqlite://PATH`; over TLS `rediss://…`,
/// `rediss-cluster://…`, `postgres://…?sslmode=…` and `mysql://…?ssl-mode=…` (a CA of your own by `SSL_CERT_FILE`) (the durable stores need the
/// crate's feature of that name), chosen at run time behind one type, keeping completed keys
/// for `retention` (`None`: for good).
pub async fn open_store(options: &Options) -> Result<DynStore, String> {
    let (url, retention) = (options.store.as_str(), options.retention);
    if url == "memory" {
        let store = match options.max_records {
            Some(max) => MemoryStore::builder().max_records(max),
            None => MemoryStore::builder().unbounded(),
        };
        let store = retained!(store, retention).tombstones(options.tombstones);
        return Ok(DynStore::new(store.build()));
    }
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        #[cfg(feature = "redis")]
        {
            let store = tower_idempotency::store::RedisStore::connect(url)
                .await
                .map_err(|e| format!("{e:#}"))?;
            let store = replicas_waited(retained!(store, retention), options);
            return Ok(DynStore::new(store));
        }
        #[cfg(not(feature = "redis"))]
        return Err("build with --features redis".to_owned());
    }
    // `rediss-cluster://` for a cluster over TLS.
    let cluster = url
        .strip_prefix("redis-cluster://")
        .map(|seeds| ("redis", seeds))
        .or_else(|| {
            url.strip_prefix("rediss-cluster://")
                .map(|seeds| ("rediss", seeds))
        });
    if let Some((scheme, seeds)) = cluster {
        #[cfg(feature = "redis")]
        {
            let seeds = seeds.split(',').map(|seed| format!("{scheme}://{seed}"));
            let store = tower_idempotency::store::RedisStore::connect_cluster(seeds)
                .await
                .map_err(|e| format!("{e:#}"))?;
            let store = replicas_waited(retained!(store, retention), options);
            return Ok(DynStore::new(store));
        }
        #[cfg(not(feature = "redis"))]
        return Err(format!(
            "{scheme}-cluster://{seeds}: build with --features redis"
        ));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let store = tower_idempotency::store::PostgresStore::connect(url)
                .await
                .map_err(|e| format!("{e:#}"))?;
            let store = retained!(store, retention).tombstones(options.tombstones);
            store.migrate().await.map_err(|e| format!("{e:#}"))?;
            keep_purging(options, || store.purge_every(every(options)));
            return Ok(DynStore::new(store));
        }
        #[cfg(not(feature = "postgres"))]
        return Err("build with --features postgres".to_owned());
    }
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        #[cfg(feature = "mysql")]
        {
            let store = tower_idempotency::store::MySqlStore::connect(url)
                .await
                .map_err(|e| format!("{e:#}"))?;
            let store = retained!(store, retention).tombstones(options.tombstones);
            store.migrate().await.map_err(|e| format!("{e:#}"))?;
            keep_purging(options, || store.purge_every(every(options)));
            return Ok(DynStore::new(store));
        }
        #[cfg(not(feature = "mysql"))]
        return Err("build with --features mysql".to_owned());
    }
    if let Some(path) = url.strip_prefix("sqlite://") {
        #[cfg(feature = "sqlite")]
        {
            let store = tower_idempotency::store::SqliteStore::open(path)
                .await
                .map_err(|e| format!("{e:#}"))?;
            let store = retained!(store, retention).tombstones(options.tombstones);
            keep_purging(options, || store.purge_every(every(options)));
            return Ok(DynStore::new(store));
        }
        #[cfg(not(feature = "sqlite"))]
        return Err(format!("{path}: build with --features sqlite"));
    }
    Err(
        "unsupported store: memory, redis://…, redis-cluster://HOST:PORT[,…], postgres://…, \
         mysql://… or sqlite://PATH"
            .to_owned(),
    )
}

/// One log line per request, with the outcome the layer reports.
pub async fn log(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let key = request
        .headers()
        .get(&IDEMPOTENCY_KEY)
        .map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned());
    let response = next.run(request).await;
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .map_or_else(|| "-".to_owned(), ToString::to_string);
    tracing::info!(
        "{method} {path} key={} status={} outcome={outcome} {:?}",
        key.as_deref().unwrap_or("-"),
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Ids unique across processes and restarts: a kind, this process's start time and id, then
/// a counter.
pub struct Ids {
    prefix: String,
    next: AtomicU64,
}

impl Ids {
    pub fn new(kind: &str) -> Self {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            prefix: format!("{kind}-{started:x}{:x}", std::process::id()),
            next: AtomicU64::new(1),
        }
    }

    pub fn next(&self) -> String {
        format!(
            "{}-{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// Serves `router` on `addr`, logging one line per request.
pub async fn serve(name: &str, options: &Options, router: Result<Router, String>) {
    let router = router.unwrap_or_else(|message| {
        eprintln!("--store {}: {message}", options.store);
        std::process::exit(2);
    });
    let router = router.layer(axum::middleware::from_fn(log));
    serve_metrics(options);
    let listener = match tokio::net::TcpListener::bind(options.addr).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("cannot listen on {}: {error}", options.addr);
            std::process::exit(1);
        }
    };
    tracing::info!(
        "{name} on http://{} (store: {}{})",
        options.addr,
        options.store,
        store_note()
    );
    let serve = axum::serve(listener, router).with_graceful_shutdown(terminated());
    drained(serve.into_future(), options.drain).await;
}

/// Sets up logging: `info` unless `RUST_LOG` says otherwise.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
}

/// The parsed command line, or exit 2 with the message.
pub fn options_or_exit(options: Result<Options, String>) -> Options {
    options.unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2);
    })
}
