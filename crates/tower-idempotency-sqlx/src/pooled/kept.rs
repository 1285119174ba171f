//! The connections a store's calls keep between them while calls keep coming ([`Connections`]),
//! each for a turn, and a call on one of them ([`on_connection`]).

use std::time::Duration;

use super::acquire;
use tower_idempotency_core::{StoreError, StoreErrorKind};

/// How often a call waiting for a connection while every one is the store's looks at the
/// pool again (a connection a failed call gave back goes there).
const SATURATED_POLL: Duration = Duration::from_millis(5);

/// The length of the line of waiting calls past which those that stopped waiting are dropped
/// from it.
const WAITING_SWEEP: usize = 64;

/// The least time a call must have left to start on a connection it was handed: with less, it
/// would time out mid-statement and close a sound connection; the connection goes to the next
/// call instead.
const LEAST_LEFT: Duration = Duration::from_millis(10);

/// How long the store's calls hold one of the pool's connections, handing it from call to
/// call or keeping it for the next one, before it goes back to the pool: whoever waits in
/// the pool's line (an application's handler, a transaction of the store's own) gets a turn
/// within about twice this, whether the store's calls go on or pause. sqlx tells no one who
/// waits in its line, so every connection goes back once its turn is over.
const TURN: Duration = Duration::from_millis(50);

/// A store's pool, and the connections its calls keep between them while calls keep coming.
///
/// sqlx checks every connection that goes back to its pool with a ping, a round trip (this
/// cannot be turned off), so a call that took a connection and gave it back cost two round
/// trips: half the store's rate. A call that ends well keeps its connection here instead, for
/// the next call: handed to the store's calls waiting for one, in their order, or kept idle
/// for the next call (unless the pool is out of connections and others hold some: then the
/// pool's line may hold theirs, and it goes back). Each goes back to the pool (and its ping)
/// once the store has held it for a [`TURN`], idle or not. So under load the store holds the
/// connections its calls use at once, as it would anyway, and once idle it holds none. A
/// connection whose call failed, was cancelled or timed out is never kept.
pub(crate) struct Connections<DB: sqlx::Database>(std::sync::Arc<Kept<DB>>);

impl<DB: sqlx::Database> Clone for Connections<DB> {
    fn clone(&self) -> Self {
        Self(std::sync::Arc::clone(&self.0))
    }
}

pub(crate) struct Kept<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    state: std::sync::Mutex<KeptState<DB>>,
    /// Whether a task gives back the connections not used again in time.
    reaping: std::sync::atomic::AtomicBool,
    /// The pool's connections the store's calls have now, in a call or kept.
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A connection of the pool a store call has (in a call, or kept): counted while it is.
pub(crate) struct Held<DB: sqlx::Database> {
    connection: sqlx::pool::PoolConnection<DB>,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// When the store took it from the pool.
    since: tokio::time::Instant,
}

impl<DB: sqlx::Database> Held<DB> {
    fn new(
        connection: sqlx::pool::PoolConnection<DB>,
        held: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) -> Self {
        held.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self {
            connection,
            held: std::sync::Arc::clone(held),
            since: tokio::time::Instant::now(),
        }
    }
}

impl<DB: sqlx::Database> Drop for Held<DB> {
    fn drop(&mut self) {
        self.held.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl<DB: sqlx::Database> std::ops::Deref for Held<DB> {
    type Target = sqlx::pool::PoolConnection<DB>;

    fn deref(&self) -> &sqlx::pool::PoolConnection<DB> {
        &self.connection
    }
}

impl<DB: sqlx::Database> std::ops::DerefMut for Held<DB> {
    fn deref_mut(&mut self) -> &mut sqlx::pool::PoolConnection<DB> {
        &mut self.connection
    }
}

struct KeptState<DB: sqlx::Database> {
    /// The connections kept, the most recently used last.
    idle: Vec<Held<DB>>,
    /// The calls waiting for a connection while every one the pool may make is out, first
    /// come first; a call that stopped waiting leaves its sender closed.
    waiting: std::collections::VecDeque<tokio::sync::oneshot::Sender<Held<DB>>>,
}

impl<DB: sqlx::Database> Connections<DB> {
    pub(crate) fn new(pool: sqlx::Pool<DB>) -> Self {
        Self(std::sync::Arc::new(Kept {
            pool,
            state: std::sync::Mutex::new(KeptState {
                idle: Vec::new(),
                waiting: std::collections::VecDeque::new(),
            }),
            reaping: std::sync::atomic::AtomicBool::new(false),
            held: std::sync::Arc::default(),
        }))
    }

    pub(crate) fn pool(&self) -> &sqlx::Pool<DB> {
        &self.0.pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptState<DB>> {
        self.0
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether every connection the pool may make is out.
    fn saturated(&self) -> bool {
        let pool = &self.0.pool;
        pool.num_idle() == 0 && pool.size() >= pool.options().get_max_connections()
    }

    /// Whether every connection the pool may make is out and some are others' (the
    /// application's, a transaction's): then others may be in the pool's line.
    fn others_wait(&self) -> bool {
        self.saturated() && self.others_hold()
    }

    /// Whether some of the pool's connections are others'.
    fn others_hold(&self) -> bool {
        self.0.held.load(std::sync::atomic::Ordering::Acquire)
            < usize::try_from(self.0.pool.size()).unwrap_or(usize::MAX)
    }

    /// A kept connection, the most recently used; else the first one a call keeps (in line
    /// with the other calls waiting) or one of the pool (in sqlx's line, with everyone else
    /// who uses the pool), whichever comes first.
    pub(crate) async fn take(&self) -> Result<Held<DB>, StoreError> {
        let mut waiting = {
            let mut state = self.lock();
            // The most recently used first; one whose turn is over goes back to the pool.
            while let Some(connection) = state.idle.pop() {
                if connection.since.elapsed() < TURN {
                    return Ok(connection);
                }
            }
            // The calls that stopped waiting, dropped once the line grows.
            if state.waiting.len() >= WAITING_SWEEP {
                state.waiting.retain(|waiting| !waiting.is_closed());
            }
            let (handed, waiting) = tokio::sync::oneshot::channel();
            state.waiting.push_back(handed);
            waiting
        };
        // While every connection is the store's, one comes back through this line; a call
        // that failed gives its back to the pool, looked at again every `SATURATED_POLL`.
        while self.saturated() && !self.others_hold() {
            match tokio::time::timeout(SATURATED_POLL, &mut waiting).await {
                Ok(Ok(connection)) => return Ok(connection),
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
        let held = &self.0.held;
        let mut acquiring = std::pin::pin!(async {
            acquire(&self.0.pool)
                .await
                .map(|connection| Held::new(connection, held))
        });
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(Ok(connection)) =
                std::pin::Pin::new(&mut waiting).poll(cx)
            {
                return std::task::Poll::Ready(Ok(connection));
            }
            acquiring.as_mut().poll(cx)
        })
        .await
    }

    /// Hands `connection` to the first call waiting for one, or keeps it for the next call,
    /// up to the pool's size, until its [`TURN`] is over: a task gives back the kept ones
    /// whose turn is over. One whose turn is over goes back to the pool at once.
    pub(crate) fn keep(&self, connection: Held<DB>) {
        if connection.since.elapsed() >= TURN {
            return;
        }
        let limit = usize::try_from(self.0.pool.options().get_max_connections()).unwrap_or(0);
        let mut connection = connection;
        {
            let mut state = self.lock();
            while let Some(waiting) = state.waiting.pop_front() {
                match waiting.send(connection) {
                    Ok(()) => return,
                    // That call stopped waiting: the next.
                    Err(back) => connection = back,
                }
            }
            // Full, or others wait in the pool's line (the application's handlers, a
            // transaction's begin): theirs.
            if state.idle.len() >= limit || self.others_wait() {
                drop(state);
                return;
            }
            state.idle.push(connection);
        }
        if !self
            .0
            .reaping
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            let kept = std::sync::Arc::downgrade(&self.0);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(TURN).await;
                    let Some(kept) = kept.upgrade() else { return };
                    let connections = Connections(kept);
                    let (over, done) = {
                        let mut state = connections.lock();
                        let (over, current) = std::mem::take(&mut state.idle)
                            .into_iter()
                            .partition::<Vec<_>, _>(|kept| kept.since.elapsed() >= TURN);
                        state.idle = current;
                        let done = state.idle.is_empty();
                        if done {
                            connections
                                .0
                                .reaping
                                .store(false, std::sync::atomic::Ordering::Release);
                        }
                        (over, done)
                    };
                    // Back to the pool, outside the lock.
                    drop(over);
                    if done {
                        return;
                    }
                }
            });
        }
    }
}

/// Runs `call` on a connection of `connections`, both within `timeout`; the connection is
/// kept for the next call if the call answered. A call that times out closes its connection
/// rather than putting it back in the pool: sqlx would first wait, with no bound, for the
/// answer to the statement the call gave up on, and a server that went away without a word
/// would hold that pool slot for good.
pub(crate) async fn on_connection<DB: sqlx::Database, T>(
    connections: &Connections<DB>,
    timeout: Duration,
    call: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let started = tokio::time::Instant::now();
    let mut connection =
        tower_idempotency_core::backend::within(timeout, connections.take()).await?;
    let left = timeout.saturating_sub(started.elapsed());
    if left < LEAST_LEFT.min(timeout) {
        connections.keep(connection);
        return Err(StoreError::new(StoreErrorKind::Timeout));
    }
    match tokio::time::timeout(left, call(&mut connection)).await {
        Ok(Ok(answer)) => {
            connections.keep(connection);
            Ok(answer)
        }
        // Back to the pool, which checks it.
        Ok(Err(error)) => Err(error),
        Err(_) => {
            connection.close_on_drop();
            Err(StoreError::new(StoreErrorKind::Timeout))
        }
    }
}

/// A connection of the pool for a session of the caller's own, whatever it sets in it: closed
/// when dropped, never given back, so that no setting of its session reaches another call or
/// the application sharing the pool.
#[cfg(feature = "mysql")]
pub(crate) struct OwnSession<DB: sqlx::Database>(Held<DB>);

#[cfg(feature = "mysql")]
impl<DB: sqlx::Database> OwnSession<DB> {
    /// A connection of `connections`' pool (or one the store's calls kept), within `timeout`.
    pub(crate) async fn take(
        connections: &Connections<DB>,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        tower_idempotency_core::backend::within(timeout, connections.take())
            .await
            .map(Self)
    }

    /// The connection.
    pub(crate) fn connection(&mut self) -> &mut DB::Connection {
        &mut self.0
    }
}

#[cfg(feature = "mysql")]
impl<DB: sqlx::Database> Drop for OwnSession<DB> {
    fn drop(&mut self) {
        self.0.close_on_drop();
    }
}
