//! `idempotency_keys`: the operator's command line for the records of a shared store. Look a
//! key up, list the ones a crash left pending, resolve one into a replay, forget one, purge
//! the expired records.
//!
//! ```text
//! cargo install tower-idempotency --features cli
//! idempotency_keys --store URL [--path PATH] [--method POST] [--scope SCOPE] \
//!     [--table NAME] [--retention-s N] COMMAND
//! ```
//!
//! Run `idempotency_keys --help` for the commands. Exit codes: 0 done, 1 no such record (or,
//! for `resolve`, none pending), 2 a bad command line, 3 the store failed.
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tower_idempotency::scope::store_key;
use tower_idempotency::store::{Operator, Purge, RecordState};
use tower_idempotency::store::{StoreError, StoreErrorKind, StoredResponse};

const USAGE: &str = "usage: idempotency_keys --store URL [--path PATH, for all but purge] [--method POST] \
[--scope SCOPE] [--table NAME] [--prefix PREFIX] [--wait-for-replicas N] [--retention-s N] [--timeout-s N] (show KEY | pending --older-than DURATION \
[--abandoned] | forget KEY | resolve KEY --status CODE --body-file FILE [--header 'Name: value']... \
| purge)";

const HELP: &str = "\
The operator's tool for the records of a shared idempotency store.

usage: idempotency_keys --store URL [OPTIONS] COMMAND

COMMANDS
  show KEY                       state, age, fingerprint (and status, or for a pending key
                                 whether its lease is in-progress or abandoned)
  pending --older-than DURATION [--abandoned]
                                 the keys pending at least that long, one a line (0s, 30s,
                                 5m, 2h, 1d); with --abandoned only those whose server stopped
                                 renewing their lease (it most likely died mid-create)
  forget KEY                     delete the record: the next request with the key creates
  resolve KEY --status CODE --body-file FILE [--header 'Name: value']...
                                 complete the pending key: retries get this as a replay
  purge                          delete every expired record, in batches, and print how many
                                 (PostgreSQL, MySQL and SQLite; Redis expires records by
                                 itself)

OPTIONS
  --store URL        redis://HOST:PORT, redis-cluster://HOST:PORT[,HOST:PORT...],
                     postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB or
                     sqlite://PATH; over TLS: rediss://, rediss-cluster://,
                     postgres://…?sslmode=verify-full, mysql://…?ssl-mode=VERIFY_IDENTITY
                     (trusted roots in place of the system's: SSL_CERT_FILE=PATH)
  --table NAME       the PostgreSQL or MySQL table (default idempotency_records)
  --prefix PREFIX    the Redis key prefix the servers were given with .prefix(...), if any
  --wait-for-replicas N
                     Redis: the replicas a resolve or forget waits for (0: none; default:
                     one where the key's primary has any, as the store finds at connect)
  --method METHOD    the endpoint's method (default POST; any case)
  --path PATH        the endpoint's path, as the layer saw it (/payments, say): required
                     by every command but purge
  --scope SCOPE      the key space the layer was given with .scope(...), if any
  --retention-s N    how long a resolved key replays, as the servers keep a completed key
                     (default 86400; 0 for good: give what the servers were given)
  --timeout-s N      each store call's timeout (default 1; a listing gets ten times it:
                     raise it for a Redis of millions of keys, whose listing scans them all)
  --                 what follows are words, not flags (a key that begins with -)
  -h, --help         this text

Keys are the ones clients send; the store key is derived as the layer derives it. `pending`
prints this endpoint's keys, and the sha256: digests PostgreSQL keeps for keys over 512 bytes
(whose endpoint it cannot tell); show, forget and resolve take such a digest as printed
(sha256: and 64 hexadecimal digits) as the stored key itself. Output is plain text a script
can read.

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

/// What to do.
enum Command {
    Show(String),
    /// Pending at least that long; only the abandoned ones if set.
    Pending(Duration, bool),
    Forget(String),
    Resolve(String, StoredResponse),
    /// Delete the expired records.
    Purge,
}

/// The command line, parsed.
struct Options {
    store: String,
    table: Option<String>,
    prefix: Option<String>,
    method: Method,
    path: String,
    scope: Option<String>,
    /// How long a resolved key replays, as the servers keep a completed one; `None`: for good.
    retention: Option<Duration>,
    /// Each store call's timeout (a listing gets ten times it), if not the store's default.
    timeout: Option<Duration>,
    /// The replicas a Redis write waits for, if not the store's default.
    wait_for_replicas: Option<u32>,
    command: Command,
}

/// `0s`, `500ms`, `30s`, `5m`, `2h`, `1d`.
fn duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text}: a duration needs a unit (ms, s, m, h, d)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text}: not a duration"))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text}: the unit is one of ms, s, m, h, d")),
    };
    Ok(Duration::from_millis(number.saturating_mul(millis)))
}

/// The command line, or `None` when it asks for the help.
fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let (mut store, mut table, mut method, mut path, mut scope) =
        (None, None, Method::POST, None, None);
    let mut prefix = None;
    let mut words = Vec::new();
    let (mut older_than, mut status, mut body_file) = (None, None, None);
    let mut headers = HeaderMap::new();
    let mut abandoned = false;
    let mut retention = Some(tower_idempotency::store::DEFAULT_RETENTION);
    let mut timeout = None;
    let mut wait_for_replicas = None;
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--store" => store = Some(value()?),
            "--table" => table = Some(value()?),
            "--prefix" => prefix = Some(value()?),
            "--wait-for-replicas" => {
                let replicas = value()?
                    .parse()
                    .map_err(|e| format!("--wait-for-replicas: {e}"))?;
                wait_for_replicas = Some(replicas);
            }
            // Methods are written in capitals on the wire: `post` is the endpoint's POST.
            "--method" => {
                method = value()?
                    .to_ascii_uppercase()
                    .parse()
                    .map_err(|e| format!("--method: {e}"))?
            }
            "--path" => path = Some(value()?),
            "--scope" => scope = Some(value()?),
            "--older-than" => older_than = Some(duration(&value()?)?),
            "--status" => {
                let code: u16 = value()?.parse().map_err(|e| format!("--status: {e}"))?;
                status = Some(StatusCode::from_u16(code).map_err(|e| format!("--status: {e}"))?);
            }
            "--body-file" => body_file = Some(value()?),
            "--header" => {
                let line = value()?;
                let (name, text) = line
                    .split_once(':')
                    .ok_or_else(|| format!("--header {line}: write 'Name: value'"))?;
                let name = HeaderName::try_from(name.trim()).map_err(|e| format!("{name}: {e}"))?;
                let text =
                    HeaderValue::try_from(text.trim()).map_err(|e| format!("{text}: {e}"))?;
                headers.append(name, text);
            }
            "--abandoned" => abandoned = true,
            "--timeout-s" => {
                let seconds: u64 = value()?.parse().map_err(|e| format!("--timeout-s: {e}"))?;
                timeout = Some(Duration::from_secs(seconds.max(1)));
            }
            // What follows is words: a key may begin with `-`.
            "--" => words.extend(args.by_ref()),
            "--retention-s" => {
                let seconds: u64 = value()?
                    .parse()
                    .map_err(|e| format!("--retention-s: {e}"))?;
                retention = (seconds > 0).then(|| Duration::from_secs(seconds));
            }
            "--help" | "-h" => return Ok(None),
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            _ => words.push(arg),
        }
    }
    let command = match words.as_slice() {
        [show, key] if show == "show" => Command::Show(key.clone()),
        [forget, key] if forget == "forget" => Command::Forget(key.clone()),
        [pending] if pending == "pending" => {
            let older_than = older_than.ok_or("pending needs --older-than DURATION")?;
            Command::Pending(older_than, abandoned)
        }
        [resolve, key] if resolve == "resolve" => {
            let status = status.ok_or("resolve needs --status CODE")?;
            let file = body_file.ok_or("resolve needs --body-file FILE")?;
            let body = std::fs::read(&file).map_err(|e| format!("{file}: {e}"))?;
            Command::Resolve(
                key.clone(),
                StoredResponse::new(status, headers, Bytes::from(body)),
            )
        }
        [purge] if purge == "purge" => Command::Purge,
        _ => return Err("one command: show, pending, forget, resolve or purge".to_owned()),
    };
    // Every command but purge names keys of one endpoint: which one is not guessed.
    let path = match (path, &command) {
        (Some(path), _) => path,
        (None, Command::Purge) => String::new(),
        (None, _) => return Err("--path PATH is required: the endpoint's path".to_owned()),
    };
    Ok(Some(Options {
        store: store.ok_or("--store URL is required")?,
        table,
        prefix,
        method,
        path,
        scope,
        retention,
        timeout,
        wait_for_replicas,
        command,
    }))
}

/// What `purge` does on a store: the store's own [`Purge`], or nothing for a store that
/// deletes its expired records itself.
trait Purging {
    /// Deletes the expired records, adding how many to `purged`: `false` for a store that
    /// expires them itself.
    async fn purge(&self, purged: &mut u64) -> Result<bool, StoreError>;
}

impl Purging for tower_idempotency::store::RedisStore {
    async fn purge(&self, _: &mut u64) -> Result<bool, StoreError> {
        Ok(false)
    }
}

macro_rules! purging {
    ($($store:ident),*) => {$(
        impl Purging for tower_idempotency::store::$store {
            async fn purge(&self, purged: &mut u64) -> Result<bool, StoreError> {
                self.purge_expired_counting(purged).await.map(|()| true)
            }
        }
    )*};
}
purging!(PostgresStore, MySqlStore, SqliteStore);

/// Whether `key` is a stored digest as `pending` prints it: `sha256:` and 64 lowercase
/// hexadecimal digits (PostgreSQL and MySQL keep a key over 512 bytes so).
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
        Command::Show(key) => match store.inspect(&key_of(key)).await? {
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
        Command::Pending(age, only_abandoned) => {
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
        Command::Forget(key) => {
            if store.forget(&key_of(key)).await? {
                out!("forgotten {key}");
                Ok(0)
            } else {
                eprintln!("no record for {key}");
                Ok(1)
            }
        }
        Command::Resolve(key, response) => match store.resolve(&key_of(key), response).await {
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
        Command::Purge => {
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

/// `store` keeping a completed key for `--retention-s`, or for good, with `--timeout-s`'s
/// timeout if given: every store has these settings.
macro_rules! configured {
    ($store:expr, $options:expr) => {{
        let store = match $options.retention {
            Some(retention) => $store.retention(retention),
            None => $store.keep_forever(),
        };
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
    use tower_idempotency::store::{MySqlStore, PostgresStore, RedisStore, SqliteStore};
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
    let options = match parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            out!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("{message}");
            eprintln!("{USAGE}");
            eprintln!("(idempotency_keys --help for more)");
            return ExitCode::from(2);
        }
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
