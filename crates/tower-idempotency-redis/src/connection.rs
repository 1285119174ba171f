//! The connection of a Redis store, to one server or to a Redis Cluster, and the channel it
//! hears of changes on.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

use super::cluster::Cluster;
use tower_idempotency_core::DEFAULT_TIMEOUT;
use tower_idempotency_core::backend::notifier::Source;

/// The connection of a store: to one server, or to a Redis Cluster (each command routed to
/// the node that serves its key's slot, the connection replaced if it stops answering).
#[derive(Clone)]
pub(super) enum Connection {
    Server(ConnectionManager),
    Cluster(Cluster),
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
pub(super) struct Node {
    pub(super) host: String,
    pub(super) port: u16,
}

impl Connection {
    /// Sends `cmd` to `node`; `None` (and every call on one server) lets the connection route
    /// it.
    pub(super) async fn on<T: FromRedisValue>(
        &mut self,
        node: Option<&Node>,
        cmd: &Cmd,
    ) -> RedisResult<T> {
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
    pub(super) async fn pipeline_on<T: FromRedisValue>(
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
    pub(super) async fn primaries(&mut self) -> RedisResult<Vec<Option<Node>>> {
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
pub(super) fn slot_primaries(slots: &Value) -> Option<Vec<Node>> {
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

pub(super) fn node_routing(node: &Node) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::ByAddress {
        host: node.host.clone(),
        port: node.port,
    }
}

pub(super) fn routing_to(node: &Node) -> RoutingInfo {
    RoutingInfo::SingleNode(node_routing(node))
}

/// Where a Redis store hears of changes: the channel the scripts publish on, through a
/// connection of its own to one of its servers (the first that answers: on a cluster a
/// message published on any node reaches every node).
#[derive(Clone)]
pub(super) struct Channel {
    pub(super) clients: Arc<[redis::Client]>,
    pub(super) name: Arc<str>,
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
}
