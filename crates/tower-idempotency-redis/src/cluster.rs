//! The connection to a Redis Cluster, replaced by a new one when it stops answering.
//!
//! The driver's cluster connection can wedge for good after a failover: its background task
//! waits for a lock that a repair it no longer polls holds a place for, and every later call
//! hangs until the caller's timeout, on every node, while a new connection works at once. So
//! every call is watched: once no call has been answered for [`SILENT_FOR`] while calls were
//! made, a new connection is made from the same client (one at a time) and takes the old
//! one's place; calls in flight on the old one end as they would have.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::millis;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, Value};

use tower_idempotency_core::DEFAULT_TIMEOUT;

/// How long calls go unanswered before the connection is replaced.
pub(super) const SILENT_FOR: Duration = Duration::from_secs(3);

/// A cluster connection that is replaced when it stops answering. Clones share it.
#[derive(Clone)]
pub(super) struct Cluster {
    shared: Arc<Shared>,
}

struct Shared {
    client: ClusterClient,
    current: RwLock<ClusterConnection>,
    epoch: Instant,
    /// When the first call left unanswered since the last answer was made, in ms since
    /// `epoch` (at least 1); 0 when the last call was answered.
    silent_since: AtomicU64,
    /// Whether a new connection is being made.
    replacing: AtomicBool,
    /// How many times the connection was replaced.
    replaced: AtomicU64,
}

impl Cluster {
    /// Connects through `client`.
    pub(super) async fn connect(client: ClusterClient) -> RedisResult<Self> {
        let connection = client.get_async_connection().await?;
        Ok(Self {
            shared: Arc::new(Shared {
                client,
                current: RwLock::new(connection),
                epoch: Instant::now(),
                silent_since: AtomicU64::new(0),
                replacing: AtomicBool::new(false),
                replaced: AtomicU64::new(0),
            }),
        })
    }

    /// How many times the connection was replaced.
    pub(super) fn replaced(&self) -> u64 {
        self.shared.replaced.load(Ordering::Relaxed)
    }

    fn current(&self) -> ClusterConnection {
        self.shared
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sends `cmd` as `routing` says.
    pub(super) async fn route_command(&self, cmd: Cmd, routing: RoutingInfo) -> RedisResult<Value> {
        let mut connection = self.current();
        watched(&self.shared, connection.route_command(cmd, routing)).await
    }

    /// Sends `count` commands of `pipeline` from `offset` to `route`.
    pub(super) async fn route_pipeline(
        &self,
        pipeline: Pipeline,
        offset: usize,
        count: usize,
        route: SingleNodeRoutingInfo,
    ) -> RedisResult<Vec<Value>> {
        let mut connection = self.current();
        let call = connection.route_pipeline(pipeline, offset, count, route);
        watched(&self.shared, call).await
    }
}

impl ConnectionLike for Cluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut connection = self.current();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { watched(&shared, connection.req_packed_command(cmd)).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut connection = self.current();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let call = connection.req_packed_commands(pipeline, offset, count);
            watched(&shared, call).await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Runs `call`, noting whether it was answered: a value or the server's error is an answer;
/// a lost connection, a timeout of the driver's or a call dropped before its end (the
/// store's timeout) is not.
async fn watched<T>(
    shared: &Arc<Shared>,
    call: impl Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    let mut watch = Watch {
        shared,
        answered: false,
    };
    let result = call.await;
    watch.answered = match &result {
        Ok(_) => true,
        Err(error) => matches!(error.kind(), ErrorKind::Server(_)),
    };
    result
}

/// Notes on drop whether its call was answered.
struct Watch<'a> {
    shared: &'a Arc<Shared>,
    answered: bool,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if self.answered {
            self.shared.silent_since.store(0, Ordering::Release);
        } else {
            self.shared.unanswered();
        }
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// A call went unanswered: the first since an answer starts the count; one
    /// [`SILENT_FOR`] after it replaces the connection.
    fn unanswered(self: &Arc<Self>) {
        let now = self.now_ms();
        match self
            .silent_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {}
            Err(since) if now.saturating_sub(since) >= millis(SILENT_FOR) => self.replace(),
            Err(_) => {}
        }
    }

    /// Makes a new connection in a task of its own and puts it in the old one's place; one
    /// at a time, and not without a runtime.
    fn replace(self: &Arc<Self>) {
        if self
            .replacing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.replacing.store(false, Ordering::Release);
            return;
        };
        let shared = Arc::clone(self);
        runtime.spawn(async move {
            // A task dropped unfinished (its runtime shutting down) ends the turn too.
            let _turn = Replacing(&shared);
            let connect = shared.client.get_async_connection();
            match tokio::time::timeout(DEFAULT_TIMEOUT, connect).await {
                Ok(Ok(connection)) => {
                    *shared
                        .current
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = connection;
                    shared.replaced.fetch_add(1, Ordering::Relaxed);
                    // The new connection gets a full period before it can be replaced.
                    shared.silent_since.store(0, Ordering::Release);
                    tracing::warn!(
                        "the Redis Cluster connection answered nothing for {SILENT_FOR:?}: \
                         replaced by a new one"
                    );
                }
                Ok(Err(error)) => tracing::debug!(
                    error = &error as &dyn std::error::Error,
                    "a new Redis Cluster connection failed; the next unanswered call tries again"
                ),
                Err(_) => tracing::debug!(
                    "a new Redis Cluster connection timed out; the next unanswered call tries again"
                ),
            }
        });
    }
}

/// Lets another replacement start when dropped.
struct Replacing<'a>(&'a Shared);

impl Drop for Replacing<'_> {
    fn drop(&mut self) {
        self.0.replacing.store(false, Ordering::Release);
    }
}
