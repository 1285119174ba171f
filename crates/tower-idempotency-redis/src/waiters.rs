//! The writes that wait for replicas. A `WAIT` holds back every command behind it on its
//! connection until the replicas acknowledge, so on the store's one connection waited writes
//! went one replica round trip at a time. They go on connections of their own instead, opened
//! at the first write that needs them; the store's own connection keeps the calls that wait
//! for nothing.
//!
//! On one server, each waiting connection sends its writes in groups: the writes that came
//! while the last group was out go together in one pipeline with one `WAIT` after them (one
//! round trip each, as before), and since that `WAIT` waits for the last of them, its count
//! answers them all. On a cluster a group would mix primaries, so each write goes with its
//! own `WAIT`, over [`CLUSTER_LINES`] connections in turn.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};

use tokio::sync::{mpsc, oneshot};

use super::cluster::Cluster;
use super::connect::manager_config;
use super::connection::Connection;

/// How many connections carry waited writes to one server, each sending groups. Measured
/// (`BENCHMARKS.md`, "Replicated Redis"): one connection's groups are answered one replica
/// round trip at a time; two to four keep the replica busy; more buys nothing.
const SERVER_LINES: usize = 4;

/// How many connections carry waited writes to a cluster, each write with its own `WAIT`:
/// up to this many waits in flight on each primary.
const CLUSTER_LINES: usize = 8;

/// The most writes a group takes.
const GROUP: usize = 256;

/// The most writes queued for one connection's groups: past it (a server that stopped
/// answering holds every group up) a write fails at once, unsent, rather than queue.
const QUEUED: usize = 4 * GROUP;

/// A write's answer and how many replicas acknowledged it.
pub(super) type Waited = RedisResult<(Value, u64)>;

/// Where waited writes go: the store's connections of their own, in turn.
pub(super) struct Waiters {
    open: Open,
    lines: Box<[Slot]>,
    next: AtomicUsize,
}

/// One connection's place: the connection while it is usable, and the turn to open it.
#[derive(Default)]
struct Slot {
    line: RwLock<Option<Line>>,
    /// Held while the connection is opened, so that it is opened once.
    opening: tokio::sync::Mutex<()>,
}

impl Slot {
    /// The connection, if it is usable: one whose group sender ended (its runtime shut
    /// down) is not.
    fn usable(&self) -> Option<Line> {
        let line = self.line.read().unwrap_or_else(PoisonError::into_inner);
        line.as_ref()
            .filter(|line| match line {
                Line::Grouped(queue) => !queue.is_closed(),
                Line::Cluster(_) => true,
            })
            .cloned()
    }
}

/// How a waiting connection is opened: as the store's own one was. (One a store, so its
/// size does not matter.)
#[allow(clippy::large_enum_variant)]
enum Open {
    Server(redis::Client),
    Cluster(ClusterClient),
}

/// One waiting connection: to one server, the queue of its group sender; to a cluster, the
/// connection itself.
#[derive(Clone)]
enum Line {
    Grouped(mpsc::Sender<Write>),
    Cluster(Connection),
}

/// A write waiting for its group.
struct Write {
    command: Cmd,
    replicas: u32,
    wait_ms: u64,
    answer: oneshot::Sender<Waited>,
}

impl Waiters {
    /// Connections to the one server `client` reaches.
    pub(super) fn server(client: redis::Client) -> Self {
        Self::over(Open::Server(client))
    }

    /// Connections to the cluster `client` reaches.
    pub(super) fn cluster(client: ClusterClient) -> Self {
        Self::over(Open::Cluster(client))
    }

    fn over(open: Open) -> Self {
        let lines = match open {
            Open::Server(_) => SERVER_LINES,
            Open::Cluster(_) => CLUSTER_LINES,
        };
        Self {
            open,
            lines: (0..lines).map(|_| Slot::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Sends `command` and a `WAIT` for `replicas`, `wait_ms` at most, after it, on the next
    /// connection in turn (opened first if it is not yet, or again if its group sender ended
    /// with the runtime it ran on; one that fails to open is tried again by the next write
    /// that comes to it).
    pub(super) async fn send(&self, command: Cmd, replicas: u32, wait_ms: u64) -> Waited {
        let slot = &self.lines[self.next.fetch_add(1, Ordering::Relaxed) % self.lines.len()];
        let line = match slot.usable() {
            Some(line) => line,
            None => self.open(slot).await?,
        };
        match line {
            Line::Grouped(queue) => {
                let (answer, answered) = oneshot::channel();
                let write = Write {
                    command,
                    replicas,
                    wait_ms,
                    answer,
                };
                match queue.try_send(write) {
                    Ok(()) => answered.await.unwrap_or_else(|_| Err(gone())),
                    Err(mpsc::error::TrySendError::Full(_)) => Err(RedisError::from((
                        ErrorKind::Io,
                        "the Redis store's waiting connection has too many writes queued \
                         (the server is not answering); not sent",
                    ))),
                    Err(mpsc::error::TrySendError::Closed(_)) => Err(gone()),
                }
            }
            Line::Cluster(mut connection) => {
                let mut pipeline = redis::pipe();
                pipeline.add_command(command);
                pipeline.cmd("WAIT").arg(replicas).arg(wait_ms);
                pipeline.query_async(&mut connection).await
            }
        }
    }

    /// Opens `slot`'s connection, once however many writes find it missing at once; on one
    /// server its group sender runs on the current runtime.
    async fn open(&self, slot: &Slot) -> RedisResult<Line> {
        let _one_at_a_time = slot.opening.lock().await;
        if let Some(line) = slot.usable() {
            return Ok(line);
        }
        let line = match &self.open {
            Open::Server(client) => {
                let connection =
                    ConnectionManager::new_with_config(client.clone(), manager_config()).await?;
                let (queue, writes) = mpsc::channel(QUEUED);
                tokio::spawn(send_groups(connection, writes));
                Line::Grouped(queue)
            }
            Open::Cluster(client) => {
                Line::Cluster(Connection::Cluster(Cluster::connect(client.clone()).await?))
            }
        };
        *slot.line.write().unwrap_or_else(PoisonError::into_inner) = Some(line.clone());
        Ok(line)
    }
}

/// The error of a write whose group sender is gone (its runtime shut down).
fn gone() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "the Redis store's waiting connection is closed",
    ))
}

/// Sends the writes of `writes` in groups on `connection`, one group at a time: each group
/// is the writes queued while the last was out (at most [`GROUP`]) that want the same wait
/// as the first of them (store clones with other waits share the connections), then one
/// `WAIT` for them. Writes whose callers gave up before their group left are not sent.
async fn send_groups(mut connection: ConnectionManager, mut writes: mpsc::Receiver<Write>) {
    let mut queued: Vec<Write> = Vec::with_capacity(GROUP);
    loop {
        if queued.is_empty() {
            if writes.recv_many(&mut queued, GROUP).await == 0 {
                return;
            }
        } else {
            while queued.len() < GROUP {
                let Ok(write) = writes.try_recv() else { break };
                queued.push(write);
            }
        }
        queued.retain(|write| !write.answer.is_closed());
        let Some(first) = queued.first() else {
            continue;
        };
        let (replicas, wait_ms) = (first.replicas, first.wait_ms);
        let (group, later): (Vec<Write>, Vec<Write>) = queued
            .drain(..)
            .partition(|write| (write.replicas, write.wait_ms) == (replicas, wait_ms));
        queued = later;
        let mut pipeline = redis::pipe();
        pipeline.ignore_errors();
        let mut callers = Vec::with_capacity(group.len());
        for write in group {
            pipeline.add_command(write.command);
            callers.push(write.answer);
        }
        pipeline.cmd("WAIT").arg(replicas).arg(wait_ms);
        let answers: RedisResult<Vec<RedisResult<Value>>> =
            pipeline.query_async(&mut connection).await;
        match answers {
            Ok(mut answers) if answers.len() == callers.len() + 1 => {
                let acknowledged = match answers.pop() {
                    Some(Ok(Value::Int(count))) => u64::try_from(count).ok(),
                    _ => None,
                };
                for (caller, answer) in callers.into_iter().zip(answers) {
                    let waited = match acknowledged {
                        Some(acknowledged) => answer.map(|value| (value, acknowledged)),
                        None => Err(RedisError::from((
                            ErrorKind::Parse,
                            "an unreadable WAIT answer",
                        ))),
                    };
                    let _ = caller.send(waited);
                }
            }
            Ok(_) => {
                for caller in callers {
                    let _ = caller.send(Err(RedisError::from((
                        ErrorKind::Parse,
                        "a pipeline answered with the wrong count",
                    ))));
                }
            }
            Err(error) => {
                for caller in callers {
                    let _ = caller.send(Err(error.clone()));
                }
            }
        }
    }
}

impl std::fmt::Debug for Waiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiters").finish_non_exhaustive()
    }
}
