//! The Redis store: shared by every replica, durable only with Redis persistence on.

/// The Redis driver the [`RedisStore`] is built on, re-exported so you get a matching version.
pub use ::redis;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind, Value};

mod connection;
mod operator;
mod scripts;

use self::connection::{Channel, Connection};
use self::operator::{loosest, node_eviction_policy};
use self::scripts::{CLAIM, COMPLETE, INSPECT, Lua, RELEASE, RENEW, RESOLVE, Scripts};
use super::codec;
use super::notifier::{self, Notifier};
use super::waiting;
use super::{
    CHANGE_POLL_INTERVAL, Claim, DEFAULT_TIMEOUT, Lease, Reservation, Store, StoreError,
    StoreErrorKind, StoredResponse, retention_millis, within,
};
use crate::fingerprint::Fingerprint;

/// A registry in Redis, shared by every replica that points at the same server.
///
/// Each record is one hash under `prefix + key` (so every script touches one key and runs on
/// Redis Cluster too). Every operation is **one round trip**: a Lua script that Redis runs
/// atomically (`EVALSHA`; after a server restart the first call of each script also loads it).
/// A replay carries the stored response in the claim's answer.
///
/// A complete, release or resolve also publishes the record's key on the channel
/// `tower-idempotency:changed` (the user needs the right to publish and subscribe there; without
/// it waiters poll): a store
/// made by [`connect`](RedisStore::connect) listens there with one subscriber connection
/// (opened on the first wait), so a request waiting for a first attempt
/// ([`pending_wait`](crate::IdempotencyLayer::pending_wait)) is woken by a completion on any
/// replica.
///
/// Completed records expire after the [retention](RedisStore::retention) (24 hours unless
/// set) by their time to live: Redis deletes them itself, nothing to purge
/// ([`keep_forever`](RedisStore::keep_forever) gives them none). Pending records never
/// expire, since expiring one could let a retry create a second time. A pending record is
/// left behind, with no time to live, when the layer could not finish its key:
///
/// - a create that failed without an answer (the inner service's error, a panic, a response
///   over the cap): it may have taken effect, so its key stays taken (see
///   [`StoredResponses`](crate::StoredResponses));
/// - a create or an admission that was running when its process died or its runtime shut
///   down (an admission that panicked, too);
/// - a claim whose answer was lost, or a complete or a release (after a refused admission,
///   or a create's answer that is not stored) that failed, when the layer could not settle
///   it: the store stayed away for about half a minute, more keys than the layer's
///   settling bound were waiting to be settled, or the store answered with an error other
///   than a lost answer.
///
/// A replay, a conflict, a refused body and a completed create leave nothing without a
/// time to live. So such records grow only with those failures, one a failed request: an
/// outage of the create's downstream that fails every request on distinct keys grows them
/// at the request rate. The operator's tool lists them (`idempotency_keys --store URL
/// pending --older-than 5m --abandoned`: pending past their lease, nobody renewing; give it
/// `--timeout-s` for a store of millions of keys, since the listing scans every key), and
/// `resolve` or `forget` ends each. A layer with
/// [`take_over_abandoned`](crate::IdempotencyLayer::take_over_abandoned) lets a client's retry
/// take over a key whose claimer allowed it too.
///
/// Durability is Redis's: with append-only persistence on, records survive a restart;
/// without it, a restart forgets every key.
///
/// The connection is a [`ConnectionManager`], multiplexed and reconnecting by itself. Every call
/// fails with a [`StoreError`] after the [timeout](RedisStore::timeout) (default one second), so
/// the layer fails closed while Redis is away and recovers when it returns.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::RedisStore;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379")
///     .await?
///     .prefix("labels:idempotency:")
///     .retention(Duration::from_secs(24 * 60 * 60));
/// let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    scripts: Arc<Scripts>,
    prefix: Arc<str>,
    retention_ms: u64,
    timeout: Duration,
    /// Replicas to wait for after each write, and for how long (ms).
    wait_for_replicas: Option<(u32, u64)>,
    /// Where the scripts publish each change ([`CHANGED_CHANNEL`]).
    channel: Arc<str>,
    /// Wakes the requests of this process waiting for a key, from the changes published on
    /// the channel; `None` on a connection manager of the caller's (then they poll).
    notifier: Option<Arc<Notifier<Channel>>>,
}

impl RedisStore {
    /// The default prefix of record keys.
    pub const DEFAULT_PREFIX: &'static str = "idempotency:";

    /// Connects to `url` (`redis://host:port/db`) with the default timeout.
    ///
    /// At connect it reads the server's `maxmemory-policy`: any policy but `noeviction` may
    /// evict records (completed ones carry a TTL, which `volatile-*` policies evict first)
    /// and let a retry create again, so it is refused; see
    /// [`connect_allowing_eviction`](Self::connect_allowing_eviction). A server that does not
    /// answer `CONFIG GET` (a managed service that renamed it) is accepted with a warning.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the URL is invalid or the server cannot be reached within the
    /// timeout; [`StoreErrorKind::InvalidConfig`] if the server may evict records.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_allowing_eviction(url)
            .await?
            .refusing_eviction()
            .await
    }

    /// The server's `maxmemory-policy` (`noeviction` when it has no memory limit, so evicts
    /// nothing), or `None` if it does not say. On a cluster, the first primary's policy that
    /// may evict, else `None` if any primary does not say, else `noeviction`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the server cannot be reached within the timeout.
    pub async fn eviction_policy(&self) -> Result<Option<String>, StoreError> {
        let mut connection = self.connection.clone();
        let call = async {
            let mut policies = Vec::new();
            for node in connection.clone().primaries().await.map_err(unavailable)? {
                policies.push(node_eviction_policy(&mut connection, node.as_ref()).await?);
            }
            Ok(loosest(policies))
        };
        within(self.timeout, call).await
    }

    /// Connects like [`connect`](Self::connect) without checking the eviction policy: for a
    /// server you know keeps the store's records (a dedicated instance, say), or whose policy
    /// you accept.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the URL is invalid or the server cannot be reached within the
    /// timeout.
    pub async fn connect_allowing_eviction(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(unavailable)?;
        let client_for_notifier = client.clone();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(DEFAULT_TIMEOUT))
            // No response timeout of its own: every call runs within the store's configured
            // timeout instead, which may be longer than the default, and reports `Timeout`.
            .set_response_timeout(None)
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let connect = async {
            ConnectionManager::new_with_config(client, config)
                .await
                .map_err(unavailable)
        };
        let connection = within(DEFAULT_TIMEOUT, connect).await?;
        Ok(Self::from_manager(connection).listening_on(vec![client_for_notifier]))
    }

    /// Connects to a Redis Cluster through `seeds` (`redis://host:port` URLs of some of its
    /// nodes; the others are found from them), with the default timeout, and checks the
    /// eviction policy of every primary as [`connect`](Self::connect) does.
    ///
    /// Each record is one key, so every script runs on the one node that serves the key's
    /// slot, in one round trip as on one server. Changes are published on the cluster bus and
    /// heard through a subscriber connection to the first seed that answers.
    ///
    /// While a primary is down (and no replica has taken over its slots), the calls for its
    /// keys fail with a [`StoreError`] after the timeout, so the layer answers
    /// `503 store_unavailable` for them; the rest of the keys keep working, and the store
    /// recovers by itself when the node is back.
    ///
    /// ```no_run
    /// use tower_idempotency::store::RedisStore;
    ///
    /// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
    /// let store = RedisStore::connect_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a URL is invalid or no seed answers within the timeout;
    /// [`StoreErrorKind::InvalidConfig`] if a primary may evict records.
    pub async fn connect_cluster<I, S>(seeds: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::connect_cluster_allowing_eviction(seeds)
            .await?
            .refusing_eviction()
            .await
    }

    /// Connects like [`connect_cluster`](Self::connect_cluster) without checking the
    /// eviction policy.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if a URL is invalid or no seed answers within the timeout.
    pub async fn connect_cluster_allowing_eviction<I, S>(seeds: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let clients = seeds
            .into_iter()
            .map(|seed| redis::Client::open(seed.as_ref()))
            .collect::<RedisResult<Vec<_>>>()
            .map_err(unavailable)?;
        if clients.is_empty() {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidConfig,
                "a Redis Cluster needs at least one seed node",
            ));
        }
        let client = ClusterClientBuilder::new(
            clients
                .iter()
                .map(redis::Client::get_connection_info)
                .cloned(),
        )
        .connection_timeout(DEFAULT_TIMEOUT)
        // Every call runs within the store's own timeout; a few quick retries follow a
        // slot that moved or a connection that dropped, and a caller that gave up is
        // never retried. A node's answer is waited for a second at most, so that a hung
        // node also fails the client's own topology queries rather than stalling them.
        .response_timeout(DEFAULT_TIMEOUT)
        .overall_response_timeout(None)
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(200)
        .build()
        .map_err(unavailable)?;
        let connect = async { client.get_async_connection().await.map_err(unavailable) };
        let connection = within(DEFAULT_TIMEOUT, connect).await?;
        Ok(Self::over(Connection::Cluster(connection)).listening_on(clients))
    }

    /// `self`, refused if its server may evict records.
    async fn refusing_eviction(self) -> Result<Self, StoreError> {
        match self.eviction_policy().await? {
            Some(policy) if policy != "noeviction" => Err(StoreError::with_source(
                StoreErrorKind::InvalidConfig,
                format!(
                    "maxmemory-policy {policy} may evict idempotency records and let a retry \
                     create again: set noeviction, or connect_allowing_eviction"
                ),
            )),
            Some(_) => Ok(self),
            None => {
                tracing::warn!("cannot read the Redis maxmemory-policy; records may be evicted");
                Ok(self)
            }
        }
    }

    /// `self` with a subscriber connection through `clients`, opened on the first wait.
    fn listening_on(mut self, clients: Vec<redis::Client>) -> Self {
        self.notifier = Some(Notifier::new(Channel {
            clients: clients.into(),
            name: Arc::clone(&self.channel),
        }));
        self
    }

    /// A store over a connection manager you configured yourself.
    pub fn from_manager(connection: ConnectionManager) -> Self {
        Self::over(Connection::Server(connection))
    }

    fn over(connection: Connection) -> Self {
        Self {
            connection,
            scripts: Arc::new(Scripts {
                claim: Lua::new(CLAIM),
                renew: Lua::new(RENEW),
                complete: Lua::new(COMPLETE),
                release: Lua::new(RELEASE),
                inspect: Lua::new(INSPECT),
                resolve: Lua::new(RESOLVE),
            }),
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            retention_ms: retention_millis(super::DEFAULT_RETENTION),
            timeout: DEFAULT_TIMEOUT,
            wait_for_replicas: None,
            channel: Arc::from(CHANGED_CHANNEL),
            notifier: None,
        }
    }

    /// Sets the prefix of record keys. Default `idempotency:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self
    }

    /// Lets completed records expire `retention` after they were completed. Default:
    /// [`DEFAULT_RETENTION`](super::DEFAULT_RETENTION), 24 hours. Pending records never
    /// expire. Any duration is accepted; past [`MAX_RETENTION`](super::MAX_RETENTION) (a
    /// hundred years) it is clamped.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention_ms = retention_millis(retention);
        self
    }

    /// Keeps completed records until they are forgotten, rather than for the retention
    /// window: Redis then holds every key it is sent (and refuses writes when full, with
    /// `noeviction`).
    pub fn keep_forever(mut self) -> Self {
        self.retention_ms = 0;
        self
    }

    /// Sets how long one store call may take, any duration; a call past it fails with
    /// [`StoreErrorKind::Timeout`]. Default one second.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// After every write (a new claim, a complete, a release), waits with `WAIT` until
    /// `replicas` replicas have it, at most `wait`; fewer is a failed call (`Unavailable`),
    /// which the layer treats as an unknown outcome and settles. One round trip more per write;
    /// for replicated deployments where a failover must not lose a claim the client already
    /// saw (with `min-replicas-to-write` on the primary).
    pub fn wait_for_replicas(mut self, replicas: u32, wait: Duration) -> Self {
        self.wait_for_replicas = Some((replicas, millis(wait).max(1)));
        self
    }

    /// Whether this store listens for changes published by any replica right now, so that a
    /// request waiting for a first attempt is woken by its completion (see
    /// [`pending_wait`](crate::IdempotencyLayer::pending_wait)); the listening starts on the
    /// first wait. `false` on a connection manager of your own: waiters then poll.
    pub fn notifications_subscribed(&self) -> bool {
        self.notifier
            .as_ref()
            .is_some_and(|notifier| notifier.listening())
    }

    /// How many keys requests of this process wait on now
    /// ([`pending_wait`](crate::IdempotencyLayer::pending_wait)), for metrics and tests: a key
    /// counts once however many wait on it, and a request that stops waiting leaves nothing.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
    /// let store = tower_idempotency::store::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// assert_eq!(store.waited_keys(), 0);
    /// # Ok(()) }
    /// ```
    pub fn waited_keys(&self) -> usize {
        self.notifier
            .as_ref()
            .map_or(0, |notifier| notifier.waited_keys())
    }

    /// The underlying connection manager; `None` on a Redis Cluster.
    pub fn connection(&self) -> Option<&ConnectionManager> {
        match &self.connection {
            Connection::Server(connection) => Some(connection),
            Connection::Cluster(_) => None,
        }
    }

    fn record_key(&self, key: &str) -> String {
        let mut record = String::with_capacity(self.prefix.len() + key.len());
        record.push_str(&self.prefix);
        record.push_str(key);
        record
    }

    /// After a write, waits until the configured number of replicas have it (`WAIT`), if a
    /// number is configured.
    async fn replicated(&self, record: &str) -> Result<(), StoreError> {
        let Some((replicas, wait_ms)) = self.wait_for_replicas else {
            return Ok(());
        };
        let mut connection = self.connection.clone();
        let call = async {
            let mut wait = redis::cmd("WAIT");
            wait.arg(replicas).arg(wait_ms);
            let acknowledged: u64 = match &mut connection {
                Connection::Server(connection) => wait.query_async(connection).await,
                // On the primary the record was written to, not on every primary.
                Connection::Cluster(connection) => {
                    let primary = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::with_key(record, SlotAddr::Master),
                    ));
                    connection
                        .route_command(wait, primary)
                        .await
                        .and_then(|value| Ok(u64::from_redis_value(value)?))
                }
            }
            .map_err(unavailable)?;
            if acknowledged >= u64::from(replicas) {
                Ok(())
            } else {
                Err(StoreError::with_source(
                    StoreErrorKind::Unavailable,
                    format!("written to {acknowledged} of {replicas} replicas"),
                ))
            }
        };
        within(
            self.timeout.saturating_add(Duration::from_millis(wait_ms)),
            call,
        )
        .await
    }

    /// Runs `script` on `record` with the arguments `args` writes, within the timeout.
    async fn run(
        &self,
        script: &Lua,
        record: &str,
        args: impl Fn(&mut Cmd),
    ) -> Result<Value, StoreError> {
        let mut connection = self.connection.clone();
        let command = |eval: &str, script: &str| {
            let mut command = redis::cmd(eval);
            command.arg(script).arg(1).arg(record);
            args(&mut command);
            command
        };
        let call = async {
            let by_hash = command("EVALSHA", &script.hash)
                .query_async(&mut connection)
                .await;
            match by_hash {
                Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    command("EVAL", script.code)
                        .query_async(&mut connection)
                        .await
                }
                answer => answer,
            }
            .map_err(unavailable)
        };
        within(self.timeout, call).await
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("retention_ms", &self.retention_ms)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The channel the scripts publish each changed record key on: one for every prefix, since
/// the message is the whole record key.
const CHANGED_CHANNEL: &str = "tower-idempotency:changed";

/// A duration in whole milliseconds.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn unavailable(error: redis::RedisError) -> StoreError {
    StoreError::with_source(StoreErrorKind::Unavailable, error)
}

fn token(reservation: &Reservation) -> [u8; 16] {
    reservation.as_u128().to_be_bytes()
}

/// Reads the 0/1 answer of complete and release.
fn acted(value: Value) -> Result<(), StoreError> {
    match value {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(StoreError::new(StoreErrorKind::ReservationLost)),
        _ => Err(StoreError::new(StoreErrorKind::Corrupt)),
    }
}

impl Store for RedisStore {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let record = self.record_key(key);
        let token = token(&reservation);
        let claim = self.run(&self.scripts.claim, &record, |call| {
            call.arg(fingerprint.to_hex().as_str())
                .arg(&token[..])
                .arg(retention_millis(lease.duration()))
                .arg(u8::from(lease.takes_over()));
        });
        let Value::Array(answer) = claim.await? else {
            return Err(StoreError::new(StoreErrorKind::Corrupt));
        };
        let mut answer = answer.into_iter();
        match (answer.next(), answer.next()) {
            (Some(Value::Int(0)), None) => {
                self.replicated(&record).await?;
                Ok(Claim::New(reservation))
            }
            (Some(Value::Int(1)), None) => Ok(Claim::Conflict),
            (Some(Value::Int(2)), None) => Ok(Claim::Pending),
            (Some(Value::Int(3)), Some(Value::BulkString(response))) => {
                codec::decode(Bytes::from(response)).map(Claim::Replay)
            }
            _ => Err(StoreError::new(StoreErrorKind::Corrupt)),
        }
    }

    /// Ends when another process publishes a change of `key` (the complete, release and
    /// resolve scripts publish on the store's channel, which one subscriber connection per store
    /// listens to), or after a poll interval: [`CHANGE_POLL_INTERVAL`] until the subscriber is
    /// subscribed (or on a connection manager of your own), a second while it is.
    fn changed(&self, key: &str) -> impl Future<Output = ()> + Send {
        let record = self.record_key(key);
        let (waiting, every) = match &self.notifier {
            Some(notifier) => {
                let (waiting, listening) = notifier.wait(&record);
                (Some(waiting), notifier::poll_interval(listening))
            }
            None => (None, CHANGE_POLL_INTERVAL),
        };
        waiting::until(waiting, every)
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let record = self.record_key(key);
        let token = token(reservation);
        let renew = self.run(&self.scripts.renew, &record, |call| {
            call.arg(&token[..]).arg(retention_millis(lease));
        });
        acted(renew.await?)?;
        self.replicated(&record).await
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let record = self.record_key(key);
        let (token, response) = (token(reservation), codec::encode(response));
        let complete = self.run(&self.scripts.complete, &record, |call| {
            call.arg(&token[..])
                .arg(&response[..])
                .arg(self.retention_ms)
                .arg(&*self.channel);
        });
        acted(complete.await?)?;
        self.replicated(&record).await
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        let record = self.record_key(key);
        let token = token(reservation);
        let release = self.run(&self.scripts.release, &record, |call| {
            call.arg(&token[..]).arg(&*self.channel);
        });
        acted(release.await?)?;
        self.replicated(&record).await
    }
}
