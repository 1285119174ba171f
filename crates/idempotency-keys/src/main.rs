//! `idempotency_keys`: the operator's command line for the records of a shared store. Look a
//! key up, list the ones a crash left pending, resolve one into a replay, forget one, purge
//! the expired records.
//!
//! ```text
//! cargo install idempotency-keys
//! idempotency_keys --store URL [--path PATH] [--method POST] [--scope SCOPE] \
//!     [--table NAME] [--retention-s N] [--tombstone-s N] COMMAND
//! ```
//!
//! Run `idempotency_keys --help` for the commands. Exit codes: 0 done, 1 no such record (or,
//! for `resolve`, none pending), 2 a bad command line, 3 the store failed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{CommandFactory, Parser, Subcommand};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tower_idempotency::scope::store_key;
use tower_idempotency::store::{Operator, Purge, RecordState};
use tower_idempotency::store::{StoreError, StoreErrorKind, StoredResponse};

/// What follows the options in the help: how keys are read, and the exit codes.
const AFTER_HELP: &str = "\
Keys are the ones clients send; the store key is derived as the layer derives it. `pending`
prints this endpoint's keys, and the sha256: digests PostgreSQL keeps for keys over 512 bytes
(whose endpoint it cannot tell); show, forget and resolve take such a digest as printed
(sha256: and 64 hexadecimal digits) as the stored key itself. A key that begins with - follows
--. Output is plain text a script can read.

EXIT CODES
  0 done, 1 no such record (for resolve: none pending), 2 a bad command line (a store URL,
  table or SQLite file that cannot be the store included), 3 the store failed";

/// Prints one line of output. A reader that stopped reading (`show KEY | head -1`) ends the
/// program quietly, with success, instead of a panic on the broken pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(error) = writeln!(std::io::stdout(), $($arg)*) {
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

/// The operator's tool for the records of a shared idempotency store.
#[derive(Debug, Parser)]
#[command(name = "idempotency_keys", version, after_help = AFTER_HELP)]
struct Args {
    /// The store: redis://HOST:PORT, redis-cluster://HOST:PORT[,HOST:PORT...],
    /// postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB or sqlite://PATH; over TLS:
    /// rediss://, rediss-cluster://, postgres://…?sslmode=verify-full,
    /// mysql://…?ssl-mode=VERIFY_IDENTITY (trusted roots in place of the system's:
    /// SSL_CERT_FILE=PATH). Required.
    #[arg(long, global = true, value_name = "URL")]
    store: Option<String>,
    /// The PostgreSQL or MySQL table (default idempotency_records).
    #[arg(long, global = true, value_name = "NAME")]
    table: Option<String>,
    /// The Redis key prefix the servers were given with .prefix(...), if any.
    #[arg(long, global = true)]
    prefix: Option<String>,
    /// Redis: the replicas a resolve or forget waits for (0: none; default: one where the
    /// key's primary has any, as the store finds at connect).
    #[arg(long, global = true, value_name = "N")]
    wait_for_replicas: Option<u32>,
    /// The endpoint's method (default POST; any case).
    #[arg(long, global = true, value_parser = method, default_value = "POST")]
    method: Method,
    /// The endpoint's path, as the layer saw it (/payments, say): required by every command
    /// but purge.
    #[arg(long, global = true)]
    path: Option<String>,
    /// The key space the layer was given with .scope(...), if any.
    #[arg(long, global = true)]
    scope: Option<String>,
    /// How long a resolved key replays, as the servers keep a completed key (default 86400;
    /// 0 for good: give what the servers were given).
    #[arg(long, global = true, value_name = "N")]
    retention_s: Option<u64>,
    /// How long a resolved key is remembered past its replay window, refused as expired, as
    /// the servers keep one (default 604800, a week; 0 none: give what the servers were given).
    #[arg(long, global = true, value_name = "N")]
    tombstone_s: Option<u64>,
    /// Each store call's timeout (default 1; a listing gets ten times it: raise it for a
    /// Redis of millions of keys, whose listing scans them all).
    #[arg(long, global = true, value_name = "N")]
    timeout_s: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
enum Command {
    /// State, age, fingerprint (and status, or for a pending key whether its lease is
    /// in-progress or abandoned).
    Show {
        /// The key a client sent (or a stored sha256: digest).
        key: String,
    },
    /// The keys pending at least that long, one a line.
    Pending {
        /// 0s, 500ms, 30s, 5m, 2h, 1d.
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        older_than: Duration,
        /// Only those whose server stopped renewing their lease (it most likely died
        /// mid-create).
        #[arg(long)]
        abandoned: bool,
    },
    /// Delete the record: the next request with the key creates.
    Forget {
        /// The key a client sent (or a stored sha256: digest).
        key: String,
    },
    /// Complete the pending key: retries get this response as a replay.
    Resolve {
        /// The key a client sent (or a stored sha256: digest).
        key: String,
        /// The response's status.
        #[arg(long, value_name = "CODE", value_parser = status)]
        status: StatusCode,
        /// The file that holds the response's body.
        #[arg(long, value_name = "FILE")]
        body_file: PathBuf,
        /// A header of the response ('Name: value'); repeatable.
        #[arg(long = "header", value_name = "'Name: value'", value_parser = header)]
        headers: Vec<(HeaderName, HeaderValue)>,
    },
    /// Delete every expired record, in batches, and print how many (PostgreSQL, MySQL and
    /// SQLite; Redis expires records by itself).
    Purge,
}

/// The command line, resolved.
struct Options {
    store: String,
    table: Option<String>,
    prefix: Option<String>,
    method: Method,
    path: String,
    scope: Option<String>,
    /// How long a resolved key replays, as the servers keep a completed one; `None`: for good.
    retention: Option<Duration>,
    /// How long a resolved key is remembered past its replay window.
    tombstones: Duration,
    /// Each store call's timeout (a listing gets ten times it), if not the store's default.
    timeout: Option<Duration>,
    /// The replicas a Redis write waits for, if not the store's default.
    wait_for_replicas: Option<u32>,
    command: Action,
}

/// What to do, with what it needs read.
enum Action {
    Show(String),
    /// Pending at least that long; only the abandoned ones if set.
    Pending(Duration, bool),
    Forget(String),
    Resolve(String, StoredResponse),
    /// Delete the expired records.
    Purge,
}

/// Methods are written in capitals on the wire: `post` is the endpoint's POST.
fn method(text: &str) -> Result<Method, String> {
    Method::from_bytes(text.to_ascii_uppercase().as_bytes()).map_err(|e| e.to_string())
}

fn status(text: &str) -> Result<StatusCode, String> {
    let code: u16 = text.parse().map_err(|e| format!("{e}"))?;
    StatusCode::from_u16(code).map_err(|e| e.to_string())
}

fn header(line: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, text) = line.split_once(':').ok_or("write 'Name: value'")?;
    let name = HeaderName::try_from(name.trim()).map_err(|e| format!("{name}: {e}"))?;
    let text = HeaderValue::try_from(text.trim()).map_err(|e| format!("{text}: {e}"))?;
    Ok((name, text))
}

/// `0s`, `500ms`, `30s`, `5m`, `2h`, `1d`.
fn duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or("a duration needs a unit (ms, s, m, h, d)")?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| "not a duration")?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err("the unit is one of ms, s, m, h, d".into()),
    };
    Ok(Duration::from_millis(number.saturating_mul(millis)))
}

/// The options `args` describe; an error, as clap words it, for what the parser alone cannot
/// refuse (a missing store or path, a body file that cannot be read).
fn options(args: Args) -> Result<Options, clap::Error> {
    let usage = |kind, message: String| Args::command().error(kind, message);
    use clap::error::ErrorKind::{Io, MissingRequiredArgument};
    let command = match args.command {
        Command::Show { key } => Action::Show(key),
        Command::Pending {
            older_than,
            abandoned,
        } => Action::Pending(older_than, abandoned),
        Command::Forget { key } => Action::Forget(key),
        Command::Resolve {
            key,
            status,
            body_file,
            headers,
        } => {
            let body = std::fs::read(&body_file)
                .map_err(|e| usage(Io, format!("{}: {e}", body_file.display())))?;
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.append(name, value);
            }
            Action::Resolve(key, StoredResponse::new(status, map, Bytes::from(body)))
        }
        Command::Purge => Action::Purge,
    };
    // Every command but purge names keys of one endpoint: which one is not guessed.
    let path = match (args.path, &command) {
        (Some(path), _) => path,
        (None, Action::Purge) => String::new(),
        (None, _) => {
            return Err(usage(
                MissingRequiredArgument,
                "--path PATH is required: the endpoint's path".into(),
            ));
        }
    };
    let store = args
        .store
        .ok_or_else(|| usage(MissingRequiredArgument, "--store URL is required".into()))?;
    Ok(Options {
        store,
        table: args.table,
        prefix: args.prefix,
        method: args.method,
        path,
        scope: args.scope,
        retention: match args.retention_s {
            None => Some(tower_idempotency::store::DEFAULT_RETENTION),
            Some(0) => None,
            Some(seconds) => Some(Duration::from_secs(seconds)),
        },
        tombstones: args.tombstone_s.map_or(
            tower_idempotency::store::DEFAULT_TOMBSTONES,
            Duration::from_secs,
        ),
        timeout: args.timeout_s.map(|s| Duration::from_secs(s.max(1))),
        wait_for_replicas: args.wait_for_replicas,
        command,
    })
}

/// What `purge` does on a store: the store's own [`Purge`], or nothing for a store that
/// deletes its expired records itself.
trait Purging {
    /// Deletes the expired records, adding how many to `purged`: `false` for a store that
    /// expires them itself.
    async fn purge(&self, purged: &mut u64) -> Result<bool, StoreError>;
}

impl Purging for tower_idempotency_redis::RedisStore {
    async fn purge(&self, _: &mut u64) -> Result<bool, StoreError> {
        Ok(false)
    }
}

macro_rules! purging {
    ($($store:ident),*) => {$(
        impl Purging for tower_idempotency_sqlx::$store {
            async fn purge(&self, purged: &mut u64) -> Result<bool, StoreError> {
                self.purge_expired_counting(purged).await.map(|()| true)
            }
        }
    )*};
}
purging!(PostgresStore, MySqlStore, SqliteStore);

/// Whether `key` is a stored digest as `pending` prints it: `sha256:` and 64 lowercase
/// hexadecimal digits (PostgreSQL and MySQL keep a key over 512 bytes so).
/// `time` as an HTTP date, or as it is past the last one (the year 9999), which a record read
/// back from a store may hold.
fn http_date(time: std::time::SystemTime) -> String {
    // 9999-12-31T23:59:59Z, the last time an HTTP date names.
    const LAST: Duration = Duration::from_secs(253_402_300_799);
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(since) if since <= LAST => httpdate::fmt_http_date(time),
        _ => format!("{time:?}"),
    }
}

fn is_digest(key: &str) -> bool {
    key.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Runs the command on `store`; the exit code.
async fn run(store: impl Operator + Purging, options: &Options) -> Result<u8, StoreError> {
    let key_of = |key: &str| {
        // A digest as `pending` prints it is the stored key itself.
        if is_digest(key) {
            return key.to_owned();
        }
        store_key(
            options.scope.as_deref(),
            &options.method,
            &options.path,
            key,
        )
    };
    match &options.command {
        Action::Show(key) => match store.inspect(&key_of(key)).await? {
            Some(record) => {
                out!("state {}", record.state.as_str());
                match record.age {
                    Some(age) => out!("age {:.3}s", age.as_secs_f64()),
                    None => out!("age unknown"),
                }
                out!("fingerprint {}", record.fingerprint);
                if let Some(status) = record.status {
                    out!("status {}", status.as_u16());
                }
                // Expired: when it completed, where its resource is, and until when a retry
                // is refused as expired (then its key is new).
                if let Some(tombstone) = &record.tombstone {
                    out!("completed_at {}", http_date(tombstone.completed_at()));
                    if let Some(location) = tombstone.location() {
                        out!("location {}", String::from_utf8_lossy(location.as_bytes()));
                    }
                }
                if let Some(until) = record.remembered_until {
                    out!("remembered_until {}", http_date(until));
                }
                if record.state == RecordState::Pending {
                    let lease = if record.abandoned {
                        "abandoned"
                    } else {
                        "in-progress"
                    };
                    out!("lease {lease}");
                }
                Ok(0)
            }
            None => {
                eprintln!("no record for {key}");
                Ok(1)
            }
        },
        Action::Pending(age, only_abandoned) => {
            // Only this endpoint's keys, as clients sent them.
            let prefix = key_of("");
            for key in store.pending_older_than(*age).await? {
                if *only_abandoned {
                    let record = store.inspect(&key).await?;
                    if !record.is_some_and(|record| record.abandoned) {
                        continue;
                    }
                }
                if let Some(client_key) = key.strip_prefix(&prefix) {
                    out!("{client_key}");
                } else if key.starts_with("sha256:") {
                    // A key too long for the index, kept as its digest: any endpoint's.
                    out!("{key}");
                }
            }
            Ok(0)
        }
        Action::Forget(key) => {
            if store.forget(&key_of(key)).await? {
                out!("forgotten {key}");
                Ok(0)
            } else {
                eprintln!("no record for {key}");
                Ok(1)
            }
        }
        Action::Resolve(key, response) => match store.resolve(&key_of(key), response).await {
            Ok(()) => {
                out!("resolved {key}");
                Ok(0)
            }
            Err(error) if error.kind() == StoreErrorKind::ReservationLost => {
                eprintln!("{key} is not pending");
                Ok(1)
            }
            Err(error) => Err(error),
        },
        Action::Purge => {
            let mut purged = 0;
            match store.purge(&mut purged).await {
                Ok(true) => out!("purged {purged}"),
                Ok(false) => {
                    out!("purged 0");
                    eprintln!("Redis deletes each completed record when its time to live ends");
                }
                // What the batches before the failure deleted stays deleted: said, then the
                // failure.
                Err(error) => {
                    out!("purged {purged}");
                    return Err(error);
                }
            }
            Ok(0)
        }
    }
}

/// `store` keeping a completed key for `--retention-s`, or for good, then its tombstone for
/// `--tombstone-s`, with `--timeout-s`'s
/// timeout if given: every store has these settings.
macro_rules! configured {
    ($store:expr, $options:expr) => {{
        let store = match $options.retention {
            Some(retention) => $store.retention(retention),
            None => $store.keep_forever(),
        };
        let kept = store.options().tombstones($options.tombstones);
        let store = store.with_options(kept);
        match $options.timeout {
            Some(timeout) => store.timeout(timeout),
            None => store,
        }
    }};
}

/// How long a Redis write waits for the replicas `--wait-for-replicas` asks for.
const REPLICA_WAIT: Duration = Duration::from_secs(1);

/// Opens the store `--store` names and runs the command on it.
async fn open_and_run(options: &Options) -> Result<u8, StoreError> {
    use tower_idempotency_redis::RedisStore;
    use tower_idempotency_sqlx::{MySqlStore, PostgresStore, SqliteStore};
    let url = options.store.as_str();
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        // An operator looks at whatever is there, whatever the eviction policy.
        let mut store = RedisStore::connect_allowing_eviction(url).await?;
        if let Some(prefix) = &options.prefix {
            store = store.prefix(prefix.as_str());
        }
        if let Some(replicas) = options.wait_for_replicas {
            store = store.wait_for_replicas(replicas, REPLICA_WAIT);
        }
        return run(configured!(store, options), options).await;
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
        let seeds = seeds.split(',').map(|seed| format!("{scheme}://{seed}"));
        let mut store = RedisStore::connect_cluster_allowing_eviction(seeds).await?;
        if let Some(prefix) = &options.prefix {
            store = store.prefix(prefix.as_str());
        }
        if let Some(replicas) = options.wait_for_replicas {
            store = store.wait_for_replicas(replicas, REPLICA_WAIT);
        }
        return run(configured!(store, options), options).await;
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let mut store = PostgresStore::connect(url).await?;
        if let Some(table) = &options.table {
            store = store.table(table)?;
        }
        return run(configured!(store, options), options).await;
    }
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        let mut store = MySqlStore::connect(url).await?;
        if let Some(table) = &options.table {
            store = store.table(table)?;
        }
        return run(configured!(store, options), options).await;
    }
    if let Some(path) = url.strip_prefix("sqlite://") {
        // As the file is: a mistyped path is not made an empty store, and another
        // application's file is not switched to WAL or given a table.
        let store = SqliteStore::open_existing(path).await?;
        return run(configured!(store, options), options).await;
    }
    Err(StoreError::with_source(
        StoreErrorKind::InvalidConfig,
        format!("{url}: a redis://, redis-cluster://, postgres://, mysql:// or sqlite:// URL"),
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // A bad command line exits 2 with clap's message and usage; --help and --version, 0.
    let options = match options(Args::parse()) {
        Ok(options) => options,
        Err(error) => error.exit(),
    };
    match open_and_run(&options).await {
        Ok(code) => ExitCode::from(code),
        // A URL, a table or a file that cannot be the store: the command line is wrong.
        Err(error) if error.kind() == StoreErrorKind::InvalidConfig => {
            eprintln!("{}", chain(&error));
            ExitCode::from(2)
        }
        Err(error) => {
            eprintln!("{}", chain(&error));
            ExitCode::from(3)
        }
    }
}

/// A store error with its causes: a driver's own text ("db error") says little without them.
fn chain(error: &StoreError) -> String {
    format!("store: {error:#}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(line: &str) -> Result<Options, clap::Error> {
        let args = std::iter::once("idempotency_keys").chain(line.split(' '));
        options(Args::try_parse_from(args)?)
    }

    #[test]
    fn options_may_come_before_or_after_the_command() {
        let options = parse("--store redis://h --path /labels show k").unwrap();
        assert!(matches!(options.command, Action::Show(ref key) if key == "k"));
        let options =
            parse("pending --older-than 5m --abandoned --store redis://h --path /p --method put")
                .unwrap();
        assert!(
            matches!(options.command, Action::Pending(age, true) if age == Duration::from_secs(300))
        );
        assert_eq!(options.method, Method::PUT);
        assert_eq!(options.path, "/p");
        let options = parse("--store redis://h purge --retention-s 0 --timeout-s 0").unwrap();
        assert_eq!(
            (options.retention, options.timeout),
            (None, Some(Duration::from_secs(1)))
        );
        assert_eq!(
            options.tombstones,
            tower_idempotency::store::DEFAULT_TOMBSTONES,
            "a week unless told"
        );
        let options = parse("--store redis://h purge --tombstone-s 60").unwrap();
        assert_eq!(options.tombstones, Duration::from_secs(60));
        let options = parse("--store redis://h --path /p forget -- --dashed").unwrap();
        assert!(matches!(options.command, Action::Forget(ref key) if key == "--dashed"));
    }

    #[test]
    fn a_bad_command_line_is_refused_with_its_reason() {
        let kind = |line: &str| parse(line).err().map(|error| error.kind());
        assert_eq!(
            kind("--store redis://h --path /p frobnicate"),
            Some(ErrorKind::InvalidSubcommand)
        );
        assert_eq!(
            kind("--store redis://h --path /p show"),
            Some(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind("--store redis://h show k"),
            Some(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind("--path /p show k"),
            Some(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind("--store redis://h --path /p pending"),
            Some(ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            kind("--store redis://h --path /p pending --older-than 5"),
            Some(ErrorKind::ValueValidation)
        );
        assert_eq!(
            kind("--store redis://h --path /p pending --older-than 5w"),
            Some(ErrorKind::ValueValidation)
        );
        assert_eq!(
            kind("--store redis://h --path /p resolve k --status 99 --body-file f"),
            Some(ErrorKind::ValueValidation)
        );
        assert_eq!(
            kind("--store redis://h --path /p resolve k --status 201 --body-file /nonexistent/x"),
            Some(ErrorKind::Io)
        );
        assert_eq!(
            kind(
                "--store redis://h --path /p resolve k --status 201 --body-file f --header NoColon"
            ),
            Some(ErrorKind::ValueValidation)
        );
        assert_eq!(
            kind("--store redis://h --method P(ST purge"),
            Some(ErrorKind::ValueValidation)
        );
    }

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(duration("m").is_err());
    }
}
