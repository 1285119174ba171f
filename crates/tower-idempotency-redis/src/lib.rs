//! The Redis store of [`tower-idempotency`](https://docs.rs/tower-idempotency): shared by every
//! replica, durable only with Redis persistence on. Applications use it with the facade's
//! `redis` feature, at `tower_idempotency_redis::RedisStore` (this crate's [`RedisStore`]);
//! see its docs for what it guarantees and how to connect it.
//!
//! ```no_run
//! use tower_idempotency_redis::RedisStore;
//! use tower_idempotency::{IdempotencyLayer, JsonOperation};
//!
//! # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let layer = IdempotencyLayer::new(store, JsonOperation::new()).global_keys();
//! # drop(layer); Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

/// The Redis driver the [`RedisStore`] is built on, re-exported so you get a matching version.
pub use ::redis;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};

mod cluster;
mod connect;
mod connection;
mod operator;
mod replication;
mod scripts;
mod waiters;

pub use self::replication::ReplicaWait;

/// Redis primaries with replicas none of which is online yet, so that the default replica
/// wait waits for none of theirs: a gauge, no labels, set at each look at the replicas (with
/// the `metrics` feature). The facade's `metrics` module names it too.
pub const REDIS_SYNCING_PRIMARIES: &str = "idempotency_redis_syncing_primaries";

use self::cluster::Cluster;
use self::connection::{Channel, Connection, Node};
use self::operator::{loosest, node_eviction_policy};
use self::replication::{Replicas, Replication, Setting, Topology, Wanted};
use self::scripts::{CLAIM, COMPLETE, INSPECT, Lua, RELEASE, RENEW, RESOLVE, SETTLE, Scripts};
use self::waiters::Waiters;
use tower_idempotency_core::Fingerprint;
use tower_idempotency_core::StoreOptions;
use tower_idempotency_core::backend::notifier::{self, Notifier};
use tower_idempotency_core::backend::{retention_millis, waiting, within};
use tower_idempotency_core::{
    CHANGE_POLL_INTERVAL, Claim, DEFAULT_TIMEOUT, Lease, Reservation, Store, StoreError,
    StoreErrorKind, StoredResponse, codec,
};

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
/// ([`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait)) is woken by a completion on any
/// replica.
///
/// Completed records expire after the [retention](RedisStore::retention) (24 hours unless
/// set) by their time to live: Redis deletes them itself, nothing to purge
/// ([`keep_forever`](RedisStore::keep_forever) gives them none). Pending records never
/// expire, since expiring one could let a retry create a second time. A pending record is
/// left behind, with no time to live, when the layer could not finish its key:
///
/// - a create that failed without an answer (the inner service's error, a panic, a response
///   body that broke off): it may have taken effect, so its key stays taken (see
///   [`StoredResponses`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/enum.StoredResponses.html));
/// - a create or an admission that was running when its process died or its runtime shut
///   down (an admission that panicked, too);
/// - a claim whose answer was lost, or a complete or a release (after a refused admission,
///   or a create's answer that is not stored) that failed, when the layer could not settle
///   it: the store stayed away for about five minutes, more keys than the layer's
///   settling bound were waiting to be settled, or the store answered with an error other
///   than a lost answer.
///
/// A replay, a conflict, a refused body and a completed create leave nothing without a
/// time to live. So such records grow only with those failures, one a failed request: an
/// outage of the create's downstream that fails every request on distinct keys grows them
/// at the request rate. The operator's tool lists them (`idempotency_keys --store URL
/// --path PATH pending --older-than 5m --abandoned`: pending past their lease, nobody renewing; give it
/// `--timeout-s` for a store of millions of keys, since the listing scans every key), and
/// `resolve` or `forget` ends each. A layer with
/// [`take_over_abandoned`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.take_over_abandoned) lets a client's retry
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
/// use tower_idempotency_redis::RedisStore;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation};
///
/// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
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
    /// Its retention and timeout.
    options: StoreOptions,
    /// The replicas each write waits for: by default one where the record's primary has
    /// any, as last looked at.
    replication: Arc<Replication>,
    /// Where one server's replicas are looked up, on a connection of their own each time,
    /// so that a lookup never queues behind waits its replica holds up; on a cluster, the
    /// template of the connections to each primary; `None` on a connection manager of the
    /// caller's (then the lookup shares it).
    lookups: Option<redis::Client>,
    /// The connections of the writes that wait for replicas; `None` on a connection manager
    /// of the caller's (then they share it).
    waiters: Option<Arc<Waiters>>,
    /// Where the scripts publish each change ([`CHANGED_CHANNEL`]).
    channel: Arc<str>,
    /// Wakes the requests of this process waiting for a key, from the changes published on
    /// the channel; `None` on a connection manager of the caller's (then they poll).
    notifier: Option<Arc<Notifier<Channel>>>,
}

impl RedisStore {
    /// The default prefix of record keys.
    pub const DEFAULT_PREFIX: &'static str = "idempotency:";

    /// Sets the prefix of record keys. Default `idempotency:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self
    }

    /// Runs the store with `options`: its retention and its timeout. A plain value: clones
    /// made before keep theirs.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
    /// use std::time::Duration;
    /// use tower_idempotency_core::StoreOptions;
    /// use tower_idempotency_redis::RedisStore;
    ///
    /// let options = StoreOptions::new().retention(Duration::from_secs(3600));
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?.with_options(options);
    /// assert_eq!(store.options(), options);
    /// # Ok(()) }
    /// ```
    pub fn with_options(mut self, options: StoreOptions) -> Self {
        self.options = options;
        self
    }

    /// The options the store runs with.
    pub fn options(&self) -> StoreOptions {
        self.options
    }

    /// Lets completed records expire `retention` after they were completed. Default:
    /// [`DEFAULT_RETENTION`](tower_idempotency_core::DEFAULT_RETENTION), 24 hours. Pending records never
    /// expire. Any duration is accepted; past [`MAX_RETENTION`](tower_idempotency_core::MAX_RETENTION) (a
    /// hundred years) it is clamped. Shorthand for [`StoreOptions::retention`].
    pub fn retention(self, retention: Duration) -> Self {
        let options = self.options.retention(retention);
        self.with_options(options)
    }

    /// Keeps completed records until they are forgotten, rather than for the retention
    /// window: Redis then holds every key it is sent (and refuses writes when full, with
    /// `noeviction`).
    pub fn keep_forever(self) -> Self {
        let options = self.options.keep_forever();
        self.with_options(options)
    }

    /// Sets how long one store call may take, any duration; a call past it fails with
    /// [`StoreErrorKind::Timeout`]. Default one second. Shorthand for
    /// [`StoreOptions::timeout`].
    pub fn timeout(self, timeout: Duration) -> Self {
        let options = self.options.timeout(timeout);
        self.with_options(options)
    }

    /// Sets how many replicas each write waits for: after every write (a new claim, a
    /// complete, a release, a renewal, an operator's resolve or forget), a `WAIT replicas` on
    /// the primary that took it, `wait` at most. `0` turns the wait off, whatever the servers
    /// have.
    ///
    /// **By default** the store looks for replicas online when it connects (`INFO
    /// replication` on one server; `CLUSTER NODES`, then each primary's `INFO replication`
    /// on a cluster), again every second while writes go on, and at once after a wait fell
    /// short: a write on a primary that has a replica online waits for one, at most half the
    /// store's [timeout](Self::timeout) as it is at the call; a write on a primary without
    /// one waits for nothing. A replica is online once it is in sync: one waiting for or
    /// loading its first sync, or syncing again after a restart, is not waited for (a `WAIT`
    /// would block on it until it is), and the store says so in a warning and in the
    /// [`idempotency_redis_syncing_primaries`](crate::REDIS_SYNCING_PRIMARIES)
    /// gauge. A wait that fell short is looked at again before it fails the call: if the
    /// primary has no replica online any more (killed, restarting, or a failover moved the
    /// slots to a primary without one) the write stands, as one made after the look would;
    /// a replica still online that did not acknowledge in time (hung, far behind) fails it.
    /// On a cluster a replica that is away (failing, or restarting and not yet reconnected)
    /// still counts, since the cluster may promote it with what it has: its primary's writes
    /// fail until it is back (syncing, then online) or the cluster forgets it (`CLUSTER
    /// FORGET`).
    /// `connect` and `connect_cluster` return having looked. A store
    /// [over a connection of yours](Self::from_manager) looks at its first write.
    /// [`replica_wait`](Self::replica_wait) says what was found.
    ///
    /// The wait is sent with the write, on the same connection, in one round trip; a replay
    /// makes a small write of its own to be waited for too. Since a primary hands its writes
    /// to its replicas in order, a replica that has the write has everything the primary took
    /// before it: a replay is served only once its record's complete is on a replica, even
    /// if that complete's own wait fell short.
    ///
    /// Fewer replicas than wanted in time fails the call, never reporting the write as done:
    ///
    /// - a new claim is released again at once and the layer answers `503 store_unavailable`
    ///   (nothing created); a replay is not served (`503`); both are
    ///   [`Unreplicated`](StoreErrorKind::Unreplicated); the layer settles such a claim as
    ///   it settles a lost one (a replica may hold the claim and be promoted before the
    ///   undo reaches it), its settling waited for too unless the primary has no replica
    ///   online;
    /// - a complete is `Unavailable`, an unknown outcome: the layer's rule for a complete
    ///   that fails after the create applies (the client gets the create's response, the
    ///   outcome `complete_failed`), and the layer repeats the complete, waited for too,
    ///   until a replica has it; meanwhile a retry answers `409 request_pending`, never a
    ///   second create;
    /// - a release, a renewal or an operator's call is `Unavailable`.
    ///
    /// So a stored response the client was given is on a replica too, and a failover (a
    /// replica promoted after its primary died) loses no completed key; without the wait, a
    /// key whose `201` the client holds can come back pending, or free to be created again,
    /// on the promoted replica. A `wait` of `n` is strict: a primary with fewer replicas
    /// fails every write, whether its replicas are online or not. The wait needs the rights
    /// to `WAIT`, `INFO` and `CLUSTER NODES`; a server that refuses `INFO` is taken to have
    /// no replica, with a warning (on a cluster, every replica `CLUSTER NODES` lists). Under
    /// `maxmemory` with `noeviction`, a full server refuses a replay's marker, so replays
    /// fail there too.
    ///
    /// What it costs: no round trip more, but each write's reply waits for the replica's
    /// acknowledgement. Since a waiting `WAIT` holds back the commands behind it on its
    /// connection, waited writes go on connections of their own (opened at the first one):
    /// on one server four, each sending the writes that came while its last group was out
    /// together, with one `WAIT` after them; on a cluster eight, each write with its own
    /// `WAIT`. A store [over a connection of yours](Self::from_manager) sends them on that
    /// one, one replica round trip at a time. Measured on one host, everything on two cores
    /// (`BENCHMARKS.md`, "Replicated Redis"), the wait keeps about 0.7 of the creates and
    /// replays a second of the same servers with the wait off on one server, 0.6 on a
    /// cluster of three primaries with a replica each. Turn it off where a failover that
    /// forgets recent keys is acceptable. What it does not promise: a partition that leaves an old primary taking
    /// writes while its replica is promoted can still lose the writes made there
    /// (`min-replicas-to-write` on the primary narrows it); a primary's replicas are known
    /// within a second of a change; and the writes a primary took while its only replica was
    /// away or resyncing are on no replica until it is online again, so a failover in that
    /// time can lose them.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency_redis::RedisStore;
    /// use tower_idempotency_redis::ReplicaWait;
    ///
    /// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// println!("replica wait: {}", store.replica_wait()); // what the default found
    /// let two = store.clone().wait_for_replicas(2, Duration::from_millis(500));
    /// let off = store.wait_for_replicas(0, Duration::ZERO);
    /// assert_eq!(off.replica_wait(), ReplicaWait::Off);
    /// # drop(two); Ok(()) }
    /// ```
    pub fn wait_for_replicas(mut self, replicas: u32, wait: Duration) -> Self {
        let setting = if replicas == 0 {
            Setting::Off
        } else {
            Setting::Set {
                replicas,
                wait_ms: millis(wait).max(1),
            }
        };
        self.replication = Arc::new(Replication::new(setting));
        self
    }

    /// How this store waits for replicas after each write: off, as set, or as the default
    /// last found (see [`wait_for_replicas`](Self::wait_for_replicas)).
    pub fn replica_wait(&self) -> ReplicaWait {
        self.replication.describe()
    }

    /// Whether this store listens for changes published by any replica right now, so that a
    /// request waiting for a first attempt is woken by its completion (see
    /// [`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait)); the listening starts on the
    /// first wait. `false` on a connection manager of your own: waiters then poll.
    pub fn notifications_subscribed(&self) -> bool {
        self.notifier
            .as_ref()
            .is_some_and(|notifier| notifier.listening())
    }

    /// How many keys requests of this process wait on now
    /// ([`pending_wait`](https://docs.rs/tower-idempotency/latest/tower_idempotency/layer/struct.IdempotencyLayer.html#method.pending_wait)), for metrics and tests: a key
    /// counts once however many wait on it, and a request that stops waiting leaves nothing.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency_core::StoreError> {
    /// let store = tower_idempotency_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
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

    /// `self`, its replicas looked at (the default's first look).
    async fn looking_for_replicas(self) -> Result<Self, StoreError> {
        if matches!(self.replication.setting, Setting::Detect) {
            let begun = self.replication.now_ms();
            let topology = self.read_replicas().await?;
            self.replication.found(topology, begun);
        }
        Ok(self)
    }

    /// The replicas of this store's primaries, as the servers say now.
    async fn read_replicas(&self) -> Result<Topology, StoreError> {
        let mut connection = self.connection.clone();
        let unreadable = |what: &str| {
            StoreError::with_source(StoreErrorKind::Corrupt, format!("an unreadable {what}"))
        };
        let call = async {
            match &mut connection {
                Connection::Server(connection) => {
                    let mut info = redis::cmd("INFO");
                    info.arg("replication");
                    let info: RedisResult<String> = match &self.lookups {
                        Some(client) => match client.get_multiplexed_async_connection().await {
                            Ok(mut own) => info.query_async(&mut own).await,
                            Err(error) => Err(error),
                        },
                        None => info.query_async(connection).await,
                    };
                    match info {
                        Ok(info) => replication::server_replicas(&info)
                            .map(|replicas| Topology::Server { replicas })
                            .ok_or_else(|| unreadable("INFO replication answer")),
                        // A server that refuses the command (a managed service that renamed
                        // it) cannot say: wait for nothing, and say so.
                        Err(error) if matches!(error.kind(), ErrorKind::Server(_)) => {
                            tracing::warn!(
                                error = &error as &dyn std::error::Error,
                                "cannot read the Redis replicas; writes are not waited for on \
                                 them (wait_for_replicas sets a wait)"
                            );
                            Ok(Topology::Server {
                                replicas: Replicas::default(),
                            })
                        }
                        Err(error) => Err(unavailable(error)),
                    }
                }
                Connection::Cluster(cluster) => {
                    let nodes: String = redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query_async(cluster)
                        .await
                        .map_err(unavailable)?;
                    let primaries = replication::cluster_primaries(&nodes)
                        .ok_or_else(|| unreadable("CLUSTER NODES answer"))?;
                    // Each primary's own INFO, at once, on a connection of its own (a
                    // request to a hung node through the cluster connection would have the
                    // driver recover its connections, holding every call up meanwhile): only
                    // the primary knows which of its replicas are syncing. One that cannot
                    // say within half the timeout is taken to have none syncing.
                    let looks = primaries.iter().map(|primary| async move {
                        let info = async {
                            let client = node_client(self.lookups.as_ref()?, &primary.node)?;
                            let mut own = client.get_multiplexed_async_connection().await.ok()?;
                            let info: String = redis::cmd("INFO")
                                .arg("replication")
                                .query_async(&mut own)
                                .await
                                .ok()?;
                            replication::server_replicas(&info)
                        };
                        // Every replica the cluster lists counts but those its primary says
                        // are syncing: one that is away (failing, restarting) may still be
                        // promoted with what it has, so its primary's writes wait for it.
                        let counted = |syncing: u32| Replicas {
                            online: primary.listed.saturating_sub(syncing),
                            syncing,
                        };
                        tokio::time::timeout(self.options.call_timeout() / 2, info)
                            .await
                            .ok()
                            .flatten()
                            .map_or(counted(0), |replicas| counted(replicas.syncing))
                    });
                    let replicas = futures_util::future::join_all(looks).await;
                    let found: Vec<_> = primaries.into_iter().zip(replicas).collect();
                    replication::slot_ranges(&found)
                        .ok_or_else(|| unreadable("CLUSTER NODES answer"))
                }
            }
        };
        within(self.options.call_timeout(), call).await
    }

    /// Looks at the replicas again in a task of its own, if it is time to.
    fn look_again_if_due(&self) {
        if !self.replication.take_turn() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.replication.not_found();
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            // A task dropped unfinished (its runtime shutting down) ends the turn too.
            let turn = Turn(&store.replication);
            let begun = store.replication.now_ms();
            match store.read_replicas().await {
                Ok(topology) => store.replication.found(topology, begun),
                Err(error) => {
                    tracing::debug!(
                        error = &error as &dyn std::error::Error,
                        "cannot look at the Redis replicas; the next write tries again"
                    );
                    store.replication.not_found();
                }
            }
            drop(turn);
        });
    }

    /// What a write of `record` waits for; looks at the replicas first if they were never
    /// looked at (a store over a connection of the caller's, at its first write), or in the
    /// background if it is time to.
    async fn wanted(&self, record: &str) -> Result<Wanted, StoreError> {
        // Half the timeout, so that a wait that falls short is answered well within the
        // call's own bound; on a cluster below the driver's response timeout, which would
        // otherwise cut the answer off and send the write again.
        let default_wait = (millis(self.options.call_timeout()) / 2).max(1);
        let wanted = self.capped(self.replication.wanted(record, default_wait));
        if wanted != Wanted::Unknown {
            self.look_again_if_due();
            return Ok(wanted);
        }
        let begun = self.replication.now_ms();
        let topology = self.read_replicas().await?;
        self.replication.found(topology, begun);
        Ok(self.capped(self.replication.wanted(record, default_wait)))
    }

    /// `wanted`, its wait below the cluster driver's response timeout on a cluster.
    fn capped(&self, wanted: Wanted) -> Wanted {
        match (wanted, &self.connection) {
            (Wanted::Replicas(replicas, wait_ms), Connection::Cluster(_)) => {
                Wanted::Replicas(replicas, wait_ms.min(MAX_CLUSTER_WAIT_MS))
            }
            (wanted, _) => wanted,
        }
    }

    /// Runs `script` on `record` with the arguments `args` writes (and, when `wanted` has
    /// replicas, `1` as its last argument: the script then makes a write even when it
    /// changes nothing else), followed on the same connection, in one round trip, by the
    /// `WAIT` for those replicas; within the timeout, and the wait's. Since a primary hands
    /// its writes to its replicas in order, a replica that acknowledged this write has every
    /// earlier one of that primary too, whichever connection made it: a repeated complete
    /// confirms the first one's, a replay its complete's. Returns the script's answer and,
    /// if it waited, how many replicas acknowledged.
    async fn run(
        &self,
        script: &Lua,
        record: &str,
        wanted: Wanted,
        args: impl Fn(&mut Cmd),
    ) -> Result<(Value, Acknowledged), StoreError> {
        let waiting = match wanted {
            Wanted::Replicas(replicas, wait_ms) => Some((replicas, wait_ms)),
            Wanted::Nothing | Wanted::Unknown => None,
        };
        let command = |eval: &str, script: &str| {
            let mut command = redis::cmd(eval);
            command.arg(script).arg(1).arg(record);
            args(&mut command);
            if waiting.is_some() {
                command.arg(1);
            }
            command
        };
        let send = async |command: Cmd| -> RedisResult<(Value, Acknowledged)> {
            let Some((replicas, wait_ms)) = waiting else {
                let mut connection = self.connection.clone();
                let value = command.query_async(&mut connection).await?;
                return Ok((value, Acknowledged::NotAsked));
            };
            // On connections of the waits' own: a `WAIT` holds back the commands behind it.
            if let Some(waiters) = &self.waiters {
                let (value, acknowledged) = waiters.send(command, replicas, wait_ms).await?;
                return Ok((
                    value,
                    Acknowledged::By {
                        acknowledged,
                        replicas,
                    },
                ));
            }
            let mut connection = self.connection.clone();
            let mut pipeline = redis::pipe();
            pipeline.add_command(command);
            pipeline.cmd("WAIT").arg(replicas).arg(wait_ms);
            let (value, acknowledged): (Value, u64) = pipeline.query_async(&mut connection).await?;
            Ok((
                value,
                Acknowledged::By {
                    acknowledged,
                    replicas,
                },
            ))
        };
        let call = async {
            match send(command("EVALSHA", &script.hash)).await {
                Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    send(command("EVAL", script.code)).await
                }
                answer => answer,
            }
            .map_err(unavailable)
        };
        // A script missing from the server's cache is sent again whole, with a wait of its own.
        let wait = waiting.map_or(Duration::ZERO, |(_, wait_ms)| {
            Duration::from_millis(wait_ms).saturating_mul(2)
        });
        let answer = within(self.options.call_timeout().saturating_add(wait), call).await;
        if answer.is_err() && waiting.is_some() {
            self.replication.fell_short();
        }
        answer
    }

    /// `answer` once the replicas it waited for acknowledged it: fewer is an unknown outcome
    /// (`Unavailable`), and the replicas are looked at again. Under the default, the look is
    /// made at once: a replica that went away since the last look (killed, or restarted into
    /// a resync) leaves its primary none online, and a write there is not waited for, as if
    /// the look had come first. The error names the record's primary and the replicas it
    /// lacks, and says when an explicit wait refuses every write of a primary without them.
    async fn replicated<T>(
        &self,
        record: &str,
        answer: T,
        acknowledged: Acknowledged,
    ) -> Result<T, StoreError> {
        let Acknowledged::By {
            acknowledged,
            replicas,
        } = acknowledged
        else {
            return Ok(answer);
        };
        if acknowledged >= u64::from(replicas) {
            return Ok(answer);
        }
        self.replication.fell_short();
        if matches!(self.replication.setting, Setting::Detect) && self.none_online(record).await {
            tracing::debug!(
                record,
                "a replica wait fell short on a primary that has no replica online now: the \
                 write stands unwaited, as writes there are until one is"
            );
            return Ok(answer);
        }
        let primary = match (&self.connection, &self.lookups) {
            (Connection::Cluster(_), _) => format!(
                "the primary of slot {}",
                replication::slot(record.as_bytes())
            ),
            (_, Some(client)) => {
                format!("the primary {}", client.get_connection_info().addr())
            }
            (_, None) => "the primary".to_owned(),
        };
        let lacks = u64::from(replicas).saturating_sub(acknowledged);
        let mut why = format!(
            "{primary} acknowledged the write on {acknowledged} of {replicas} replicas in time: \
             it lacks {lacks}"
        );
        if let ReplicaWait::Set { .. } = self.replication.describe() {
            why.push_str(
                " (the explicit wait_for_replicas refuses every write of a primary without \
                 them, as Redis' min-replicas-to-write does: give it a replica, or lower the \
                 wait)",
            );
        }
        Err(StoreError::with_source(StoreErrorKind::Unavailable, why))
    }

    /// Whether `record`'s primary has no replica online, as a look begun after now says: the
    /// calls whose waits fell short together share one look (one at a time), its failure
    /// too; a look that fails, or does not end within the timeout, says no.
    async fn none_online(&self, record: &str) -> bool {
        let short_at = self.replication.now_ms();
        let decide = async {
            let mut last = self.replication.look_now.lock().await;
            let found = match &*last {
                Some((begun, found)) if *begun >= short_at => found.clone(),
                _ => {
                    let begun = self.replication.now_ms();
                    let found = self.read_replicas().await.ok();
                    if let Some(topology) = &found {
                        self.replication.found(topology.clone(), begun);
                    }
                    *last = Some((begun, found.clone()));
                    found
                }
            };
            drop(last);
            found.is_some_and(|topology| topology.wanted(record, 1) == Wanted::Nothing)
        };
        tokio::time::timeout(self.options.call_timeout(), decide)
            .await
            .unwrap_or(false)
    }
}

/// Ends a look's turn when dropped, however the look ended ([`Replication::not_found`]
/// after [`found`](Replication::found) changes nothing).
struct Turn<'a>(&'a Replication);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.not_found();
    }
}

/// How many replicas acknowledged a write.
#[derive(Debug, Clone, Copy)]
enum Acknowledged {
    /// None were waited for.
    NotAsked,
    /// `acknowledged` of the `replicas` waited for.
    By { acknowledged: u64, replicas: u32 },
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("RedisStore");
        debug
            .field("prefix", &self.prefix)
            .field("options", &self.options)
            .field("replica_wait", &self.replica_wait());
        if let Connection::Cluster(cluster) = &self.connection {
            debug.field("connections_replaced", &cluster.replaced());
        }
        debug.finish_non_exhaustive()
    }
}

/// The channel the scripts publish each changed record key on: one for every prefix, since
/// the message is the whole record key.
const CHANGED_CHANNEL: &str = "tower-idempotency:changed";

/// The longest replica wait on a cluster: within the driver's response timeout
/// ([`DEFAULT_TIMEOUT`]) with room for the round trip.
const MAX_CLUSTER_WAIT_MS: u64 = 800;

/// A duration in whole milliseconds.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A client for a cluster's `node`, made as `template` is (its TLS, its credentials).
fn node_client(template: &redis::Client, node: &Node) -> Option<redis::Client> {
    use redis::ConnectionAddr;
    let (host, port) = (node.host.clone(), node.port);
    let addr = match template.get_connection_info().addr() {
        ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host, port),
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => return None,
    };
    redis::Client::open(template.get_connection_info().clone().set_addr(addr)).ok()
}

/// A short replica wait on a claim the store has settled itself.
fn unreplicated(short: StoreError) -> StoreError {
    StoreError::with_source(StoreErrorKind::Unreplicated, short)
}

fn unavailable(error: redis::RedisError) -> StoreError {
    StoreError::with_source(StoreErrorKind::Unavailable, error)
}

/// Whether `error` is a connection that dropped before it answered.
fn dropped(error: &StoreError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<redis::RedisError>())
        .is_some_and(redis::RedisError::is_connection_dropped)
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
    fn replay_window(&self) -> Option<Duration> {
        self.options.retention_window()
    }

    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let record = self.record_key(key);
        let token = token(&reservation);
        // Known before the claim, so that a replay is confirmed on a replica too: its record
        // may have been completed by a write whose own wait fell short.
        let wanted = self.wanted(&record).await?;
        let args = |call: &mut Cmd| {
            call.arg(fingerprint.to_hex().as_str())
                .arg(&token[..])
                .arg(retention_millis(lease.duration()))
                .arg(u8::from(lease.takes_over()));
        };
        let claim = match self.run(&self.scripts.claim, &record, wanted, &args).await {
            // A connection whose driver is gone (the runtime it ran on shut down, a store kept
            // across runtimes) answers its next call with a dropped connection, and connects
            // again. A claim, which the same reservation makes safe to send twice (pending
            // under it, the script answers it new), is sent once more.
            Err(error) if dropped(&error) => {
                self.run(&self.scripts.claim, &record, wanted, &args).await
            }
            claim => claim,
        };
        let (Value::Array(answer), acknowledged) = claim? else {
            return Err(StoreError::new(StoreErrorKind::Corrupt));
        };
        let mut answer = answer.into_iter();
        match (answer.next(), answer.next()) {
            (Some(Value::Int(0)), None) => {
                if let Err(short) = self.replicated(&record, (), acknowledged).await {
                    // Known to be made: undone at once, without a wait of its own (which the
                    // same replica would hold up), so that no key is left pending by a
                    // replica that stays away longer than the layer settles.
                    let release =
                        self.run(&self.scripts.release, &record, Wanted::Nothing, |call| {
                            call.arg(&token[..]).arg(&*self.channel);
                        });
                    if let Err(error) = release.await {
                        tracing::warn!(
                            error = &error as &dyn std::error::Error,
                            "releasing a claim no replica confirmed failed; settled later"
                        );
                        return Err(short);
                    }
                    return Err(unreplicated(short));
                }
                Ok(Claim::New(reservation))
            }
            (Some(Value::Int(1)), None) => Ok(Claim::Conflict),
            (Some(Value::Int(2)), None) => Ok(Claim::Pending),
            // A reservation its settling fenced: this claim arrived after it.
            (Some(Value::Int(4)), None) => Err(StoreError::new(StoreErrorKind::ReservationLost)),
            (Some(Value::Int(3)), Some(Value::BulkString(response))) => {
                let replay = codec::decode(Bytes::from(response)).map(Claim::Replay)?;
                // Only the marker was written: nothing to settle.
                self.replicated(&record, replay, acknowledged)
                    .await
                    .map_err(unreplicated)
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
        let wanted = self.wanted(&record).await?;
        let renew = self.run(&self.scripts.renew, &record, wanted, |call| {
            call.arg(&token[..]).arg(retention_millis(lease));
        });
        let (answer, acknowledged) = renew.await?;
        self.replicated(&record, acted(answer), acknowledged)
            .await?
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let record = self.record_key(key);
        let (token, response) = (token(reservation), codec::encode(response));
        let wanted = self.wanted(&record).await?;
        let complete = self.run(&self.scripts.complete, &record, wanted, |call| {
            call.arg(&token[..])
                .arg(&response[..])
                .arg(self.options.retention_ms())
                .arg(&*self.channel);
        });
        let (answer, acknowledged) = complete.await?;
        self.replicated(&record, acted(answer), acknowledged)
            .await?
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        let record = self.record_key(key);
        let token = token(reservation);
        let wanted = self.wanted(&record).await?;
        let release = self.run(&self.scripts.release, &record, wanted, |call| {
            call.arg(&token[..]).arg(&*self.channel);
        });
        let (answer, acknowledged) = release.await?;
        self.replicated(&record, acted(answer), acknowledged)
            .await?
    }

    /// A lost claim may still reach the server after this (queued on a connection the store
    /// replaced, its bytes delivered late), so a release alone could come first and leave the
    /// claim to write a reservation nobody holds. In one script this releases the reservation
    /// if the claim took effect and fences it in the record's hash, for fifteen minutes: a claim
    /// of a fenced reservation writes nothing. One key, so one slot on Redis Cluster.
    async fn settle_claim(
        &self,
        key: &str,
        _fingerprint: &Fingerprint,
        reservation: Reservation,
    ) -> Result<(), StoreError> {
        let record = self.record_key(key);
        let token = token(&reservation);
        let wanted = self.wanted(&record).await?;
        let settle = self.run(&self.scripts.settle, &record, wanted, |call| {
            call.arg(&token[..]).arg(&*self.channel).arg(FENCE_MS);
        });
        let (answer, acknowledged) = settle.await?;
        match answer {
            // An undo stands on a primary with no replica online, whatever the wait asked: a
            // replica that comes online later copies it, and no replica that lacks it can be
            // promoted meanwhile. (A strict wait with too few replicas would otherwise keep
            // every settling of a claim it refused trying for minutes.)
            Value::Int(0 | 1) => match self.replicated(&record, (), acknowledged).await {
                Err(short) if !self.none_online(&record).await => Err(short),
                _ => Ok(()),
            },
            _ => Err(StoreError::new(StoreErrorKind::Corrupt)),
        }
    }
}

/// How long a lost claim's fence lives, in milliseconds: fifteen minutes, about as long as
/// Linux keeps resending data a peer has not acknowledged (`tcp_retries2`), past which a
/// claim's bytes are not delivered. The record's hash lives at least that long: a completed
/// record on a key with a fence is kept past a shorter retention, until the fence ends (a
/// retry then replays, as within the retention). An operator's `forget` drops fences too.
const FENCE_MS: u64 = 15 * 60 * 1000;
