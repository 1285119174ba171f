//! The Redis store: shared by every replica, durable only with Redis persistence on.

/// The Redis driver the [`RedisStore`] is built on, re-exported so you get a matching version.
pub use ::redis;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;

use bytes::Bytes;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, RedisResult, Script, ServerErrorKind,
    Value,
};

use super::codec;
use super::notifier::{self, Notifier, Source};
use super::waiting;
use super::{
    CHANGE_POLL_INTERVAL, Claim, DEFAULT_TIMEOUT, Lease, Operator, RecordInfo, RecordState,
    Reservation, Store, StoreError, StoreErrorKind, StoredResponse, retention_millis, within,
};
use crate::operation::Fingerprint;

/// Claim: creates the pending reservation with its lease, or reports conflict (fingerprint
/// first), pending or replay with the stored response, all in one atomic step; takes over a
/// pending record whose lease lapsed when asked to.
const CLAIM: &str = r"
local record = redis.call('HMGET', KEYS[1], 'fp', 'token', 'resp', 'until', 'tko')
if record[1] then
  if record[1] ~= ARGV[1] then return {1} end
  if record[2] == ARGV[2] then return {0} end
  if record[3] then return {3, record[3]} end
  if ARGV[4] ~= '1' or record[5] ~= '1' then return {2} end
end
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
if record[1] then
  local deadline = tonumber(record[4])
  if not deadline or now < deadline then return {2} end
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'token', ARGV[2], 'at', now, 'until', now + tonumber(ARGV[3]), 'tko', ARGV[4])
return {0}
";

/// Renew: a new lease, only while pending under this reservation.
const RENEW: &str = r"
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'until', now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[2]))
return 1
";

/// Complete: only while pending under this reservation.
const COMPLETE: &str = r"
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'resp', ARGV[2], 'at', now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('HDEL', KEYS[1], 'token', 'until', 'tko')
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
redis.pcall('PUBLISH', ARGV[4], KEYS[1])
return 1
";

/// Release: only while pending under this reservation.
const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[2], KEYS[1])
return 1
";

/// Inspect: the fingerprint, whether pending, the stored status, the age in ms (-1 if
/// unknown) and whether its lease lapsed, or nothing.
const INSPECT: &str = r"
local record = redis.call('HMGET', KEYS[1], 'fp', 'token', 'resp', 'at', 'until')
if not record[1] then return {} end
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local status = 0
if record[3] and string.len(record[3]) >= 3 then
  status = string.byte(record[3], 2) * 256 + string.byte(record[3], 3)
end
local pending = 0
if record[2] then pending = 1 end
local age = -1
local at = tonumber(record[4])
if at then age = now - at end
local abandoned = 0
local deadline = tonumber(record[5])
if record[2] and deadline and now >= deadline then abandoned = 1 end
return {record[1], pending, status, age, abandoned}
";

/// Resolve: complete a pending record, whoever reserved it.
const RESOLVE: &str = r"
if not redis.call('HGET', KEYS[1], 'token') then return 0 end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'resp', ARGV[1], 'at', now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('HDEL', KEYS[1], 'token', 'until', 'tko')
if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
redis.pcall('PUBLISH', ARGV[3], KEYS[1])
return 1
";

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
/// Completed records expire after the [retention](RedisStore::retention), if set; pending
/// records never expire. Durability is Redis's: with append-only persistence on, records
/// survive a restart; without it, a restart forgets every key.
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

/// The connection of a store: to one server, or to a Redis Cluster (each command routed to
/// the node that serves its key's slot).
#[derive(Clone)]
enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(connection) => connection.req_packed_command(cmd),
            Self::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(connection) => connection.get_db(),
            Self::Cluster(connection) => connection.get_db(),
        }
    }
}

/// A primary of a Redis Cluster, by its address.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    host: String,
    port: u16,
}

impl Connection {
    /// Sends `cmd` to `node`; `None` (and every call on one server) lets the connection route
    /// it.
    async fn on<T: FromRedisValue>(&mut self, node: Option<&Node>, cmd: &Cmd) -> RedisResult<T> {
        match (self, node) {
            (Self::Cluster(connection), Some(node)) => {
                let value = connection
                    .route_command(cmd.clone(), routing_to(node))
                    .await?;
                Ok(T::from_redis_value(value)?)
            }
            (connection, _) => cmd.query_async(connection).await,
        }
    }

    /// Sends `pipeline` to `node`, as [`on`](Self::on) sends a command.
    async fn pipeline_on<T: FromRedisValue>(
        &mut self,
        node: Option<&Node>,
        pipeline: &Pipeline,
    ) -> RedisResult<T> {
        match (self, node) {
            (Self::Cluster(connection), Some(node)) => {
                let count = pipeline.len();
                let values = connection
                    .route_pipeline(pipeline.clone(), 0, count, node_routing(node))
                    .await?;
                Ok(T::from_redis_value(Value::Array(values))?)
            }
            (connection, _) => pipeline.query_async(connection).await,
        }
    }

    /// The primaries a command about every record must reach: `[None]` on one server; on a
    /// cluster, the primary of every slot range (`CLUSTER SLOTS`, as the cluster client maps
    /// the slots), so that a primary that is down fails the command rather than being left
    /// out.
    async fn primaries(&mut self) -> RedisResult<Vec<Option<Node>>> {
        match self {
            Self::Server(_) => Ok(vec![None]),
            Self::Cluster(connection) => {
                let slots: Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(connection)
                    .await?;
                let primaries = slot_primaries(&slots).ok_or_else(|| {
                    redis::RedisError::from((
                        ErrorKind::Parse,
                        "an unreadable CLUSTER SLOTS answer",
                    ))
                })?;
                Ok(primaries.into_iter().map(Some).collect())
            }
        }
    }
}

/// The primary of every slot range of a `CLUSTER SLOTS` answer, each once:
/// `[[first, last, [host, port, id, …], replica…], …]`. `None` if any range is unreadable or
/// names no host.
fn slot_primaries(slots: &Value) -> Option<Vec<Node>> {
    let Value::Array(ranges) = slots else {
        return None;
    };
    let mut primaries = Vec::new();
    for range in ranges {
        let Value::Array(range) = range else {
            return None;
        };
        let Some(Value::Array(primary)) = range.get(2) else {
            return None;
        };
        let Value::BulkString(host) = primary.first()? else {
            return None;
        };
        let host = std::str::from_utf8(host).ok()?.to_owned();
        let Value::Int(port) = primary.get(1)? else {
            return None;
        };
        if host.is_empty() || host == "?" {
            return None;
        }
        let node = Node {
            host,
            port: u16::try_from(*port).ok()?,
        };
        if !primaries.contains(&node) {
            primaries.push(node);
        }
    }
    primaries.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    Some(primaries)
}

fn node_routing(node: &Node) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::ByAddress {
        host: node.host.clone(),
        port: node.port,
    }
}

fn routing_to(node: &Node) -> RoutingInfo {
    RoutingInfo::SingleNode(node_routing(node))
}

/// Where a Redis store hears of changes: the channel the scripts publish on, through a
/// connection of its own to one of its servers (the first that answers: on a cluster a
/// message published on any node reaches every node).
#[derive(Clone)]
struct Channel {
    clients: Arc<[redis::Client]>,
    name: Arc<str>,
}

impl Source for Channel {
    type Session = Pin<Box<dyn Stream<Item = redis::Msg> + Send>>;

    async fn listen(&self) -> Option<Self::Session> {
        // The seeds share the listener's time, so a hung one leaves time for the next.
        let seeds = u32::try_from(self.clients.len()).unwrap_or(u32::MAX).max(1);
        let each = (DEFAULT_TIMEOUT / seeds).max(Duration::from_millis(100));
        for client in self.clients.iter() {
            let subscribe = async {
                let mut pubsub = client.get_async_pubsub().await.ok()?;
                pubsub.subscribe(&*self.name).await.ok()?;
                Some(pubsub)
            };
            if let Ok(Some(pubsub)) = tokio::time::timeout(each, subscribe).await {
                return Some(Box::pin(pubsub.into_on_message()));
            }
        }
        None
    }

    fn poll_changed(session: &mut Self::Session, cx: &mut Context<'_>) -> Poll<Option<String>> {
        loop {
            match std::task::ready!(session.as_mut().poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(message) => {
                    if let Ok(key) = message.get_payload::<String>() {
                        return Poll::Ready(Some(key));
                    }
                }
            }
        }
    }
}

struct Scripts {
    claim: Lua,
    renew: Lua,
    complete: Lua,
    release: Lua,
    inspect: Lua,
    resolve: Lua,
}

/// A script of the store, sent with `EVALSHA`, and with `EVAL` (which caches it) to a server
/// that does not have it yet: after a restart, say. Both go to the one node of the script's
/// key, so a cluster node that is down or hung elsewhere cannot hold it up (`SCRIPT LOAD`
/// would go to every node).
struct Lua {
    code: &'static str,
    hash: String,
}

impl Lua {
    fn new(code: &'static str) -> Self {
        Self {
            code,
            hash: Script::new(code).get_hash().to_owned(),
        }
    }
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

impl Operator for RedisStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let record = self.record_key(key);
        let inspect = self.run(&self.scripts.inspect, &record, |_| {});
        let Value::Array(answer) = inspect.await? else {
            return Err(StoreError::new(StoreErrorKind::Corrupt));
        };
        let corrupt = || StoreError::new(StoreErrorKind::Corrupt);
        match answer.as_slice() {
            [] => Ok(None),
            [
                Value::BulkString(fingerprint),
                Value::Int(pending),
                Value::Int(status),
                Value::Int(age),
                Value::Int(abandoned),
            ] => {
                let fingerprint = std::str::from_utf8(fingerprint)
                    .ok()
                    .and_then(Fingerprint::parse)
                    .ok_or_else(corrupt)?;
                let status = http::StatusCode::from_u16(u16::try_from(*status).unwrap_or(0)).ok();
                Ok(Some(RecordInfo {
                    state: if *pending == 1 {
                        RecordState::Pending
                    } else {
                        RecordState::Completed
                    },
                    age: u64::try_from(*age).ok().map(Duration::from_millis),
                    fingerprint,
                    status: if *pending == 1 { None } else { status },
                    abandoned: *abandoned == 1,
                }))
            }
            _ => Err(corrupt()),
        }
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        let mut connection = self.connection.clone();
        let pattern = format!("{}*", glob_escape(&self.prefix));
        let min_age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        let call = async {
            let mut keys = Vec::new();
            for node in connection.primaries().await.map_err(unavailable)? {
                let node = node.as_ref();
                // Each record's age by the clock of the node that stamped it.
                let (seconds, micros): (u64, u64) = connection
                    .on(node, &redis::cmd("TIME"))
                    .await
                    .map_err(unavailable)?;
                let now = seconds * 1000 + micros / 1000;
                let mut cursor = 0u64;
                loop {
                    let mut scan = redis::cmd("SCAN");
                    scan.arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(500);
                    let (next, batch): (u64, Vec<String>) =
                        connection.on(node, &scan).await.map_err(unavailable)?;
                    let mut pipe = redis::pipe();
                    for key in &batch {
                        pipe.cmd("HMGET").arg(key).arg("token").arg("at");
                    }
                    let fields: Vec<(Option<Vec<u8>>, Option<u64>)> = if batch.is_empty() {
                        Vec::new()
                    } else {
                        connection
                            .pipeline_on(node, &pipe)
                            .await
                            .map_err(unavailable)?
                    };
                    for (key, (token, at)) in batch.into_iter().zip(fields) {
                        let old_enough = at.is_none_or(|at| now.saturating_sub(at) >= min_age);
                        if token.is_some() && old_enough {
                            keys.push(key[self.prefix.len()..].to_owned());
                        }
                    }
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            // A key whose slot moved during the listing may have been seen on both nodes.
            keys.sort_unstable();
            keys.dedup();
            Ok(keys)
        };
        // Listing reads every record: allow it ten times a call's time.
        within(self.timeout.saturating_mul(10), call).await
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        let record = self.record_key(key);
        let response = codec::encode(response);
        let resolve = self.run(&self.scripts.resolve, &record, |call| {
            call.arg(&response[..])
                .arg(self.retention_ms)
                .arg(&*self.channel);
        });
        acted(resolve.await?)?;
        self.replicated(&record).await
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let mut connection = self.connection.clone();
        let record = self.record_key(key);
        let call = async {
            let deleted: u64 = redis::cmd("DEL")
                .arg(&record)
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            // Only a wake-up: a user without the right to publish still forgets.
            let published: redis::RedisResult<u64> = redis::cmd("PUBLISH")
                .arg(&*self.channel)
                .arg(&record)
                .query_async(&mut connection)
                .await;
            if let Err(error) = published {
                tracing::debug!(%error, "publishing a forgotten key failed");
            }
            Ok(deleted > 0)
        };
        within(self.timeout, call).await
    }
}

/// The eviction policy of a set of primaries, from each one's (`None`: it does not say): the
/// first that may evict, else `None` if any does not say, else `noeviction`.
fn loosest(policies: Vec<Option<String>>) -> Option<String> {
    let mut unknown = false;
    for policy in policies {
        match policy {
            Some(policy) if policy != "noeviction" => return Some(policy),
            Some(_) => {}
            None => unknown = true,
        }
    }
    (!unknown).then(|| "noeviction".to_owned())
}

/// The `maxmemory-policy` of one server (`node`; `None` on one server), `noeviction` if it
/// has no memory limit, `None` if it does not say.
async fn node_eviction_policy(
    connection: &mut Connection,
    node: Option<&Node>,
) -> Result<Option<String>, StoreError> {
    // Any server error (CONFIG renamed, an ACL without it) means it does not say.
    let mut read = async |name: &'static str| {
        let mut config = redis::cmd("CONFIG");
        config.arg("GET").arg(name);
        match connection.on::<Value>(node, &config).await {
            Ok(value) => Ok(config_value(value)),
            Err(error) if error.is_io_error() || error.is_timeout() => Err(unavailable(error)),
            Err(_) => Ok(None),
        }
    };
    let policy = read("maxmemory-policy").await?;
    // Without a memory limit nothing is ever evicted, whatever the policy.
    if read("maxmemory").await?.as_deref() == Some("0") {
        return Ok(Some("noeviction".to_owned()));
    }
    Ok(policy)
}

/// The value of a `CONFIG GET` reply: an array `[name, value]` (RESP2) or a map (RESP3).
fn config_value(reply: Value) -> Option<String> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    match reply {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, value)| text(value)),
        _ => None,
    }
}

/// `text` with the glob characters of Redis's `MATCH` escaped.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn range(first: i64, last: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![text(host), Value::Int(port), text("id")]),
            Value::Array(vec![text("10.0.0.9"), Value::Int(7009), text("replica")]),
        ])
    }

    fn node(host: &str, port: u16) -> Node {
        Node {
            host: host.to_owned(),
            port,
        }
    }

    #[test]
    fn the_primaries_of_the_slot_ranges_each_once_in_order() {
        let slots = Value::Array(vec![
            range(10923, 16383, "10.0.0.3", 7002),
            range(0, 5460, "10.0.0.1", 7000),
            range(5461, 9000, "10.0.0.2", 7001),
            range(9001, 10922, "10.0.0.1", 7000),
        ]);
        assert_eq!(
            slot_primaries(&slots),
            Some(vec![
                node("10.0.0.1", 7000),
                node("10.0.0.2", 7001),
                node("10.0.0.3", 7002)
            ])
        );
        assert_eq!(slot_primaries(&Value::Array(vec![])), Some(vec![]));
    }

    #[test]
    fn a_slot_range_without_a_usable_primary_is_unreadable() {
        for host in ["", "?"] {
            let slots = Value::Array(vec![range(0, 16383, host, 7000)]);
            assert_eq!(slot_primaries(&slots), None, "host {host:?}");
        }
        for slots in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(1)])]),
            range(0, 1, "h", 70_000),
            Value::Array(vec![range(0, 1, "h", -1)]),
        ] {
            assert_eq!(slot_primaries(&slots), None, "{slots:?}");
        }
    }

    #[test]
    fn the_loosest_policy_of_the_primaries_counts() {
        let policy = |p: &str| Some(p.to_owned());
        assert_eq!(
            loosest(vec![policy("noeviction"), policy("noeviction")]),
            policy("noeviction")
        );
        assert_eq!(
            loosest(vec![policy("noeviction"), policy("allkeys-lru"), None]),
            policy("allkeys-lru")
        );
        assert_eq!(
            loosest(vec![None, policy("volatile-lru")]),
            policy("volatile-lru")
        );
        assert_eq!(loosest(vec![policy("noeviction"), None]), None);
        assert_eq!(loosest(vec![]), policy("noeviction"));
    }
}
