//! The operator's view of a Redis store, and the eviction policy of its servers.

use std::time::Duration;

use redis::Value;

use super::connection::{Connection, Node};
use super::replication::Wanted;
use super::{Acknowledged, RedisStore, acted, unavailable};
use tower_idempotency_core::Fingerprint;
use tower_idempotency_core::backend::within;
use tower_idempotency_core::{
    Operator, RecordInfo, RecordState, StoreError, StoreErrorKind, StoredResponse, codec,
};

impl Operator for RedisStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let record = self.record_key(key);
        let inspect = self.run(&self.scripts.inspect, &record, Wanted::Nothing, |_| {});
        let (Value::Array(answer), _) = inspect.await? else {
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
                Ok(Some(RecordInfo::new(
                    if *pending == 1 {
                        RecordState::Pending
                    } else {
                        RecordState::Completed
                    },
                    fingerprint,
                    u64::try_from(*age).ok().map(Duration::from_millis),
                    status,
                    *abandoned == 1,
                )))
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
        within(self.options.call_timeout().saturating_mul(10), call).await
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        let record = self.record_key(key);
        let response = codec::encode(response);
        let wanted = self.wanted(&record).await?;
        let resolve = self.run(&self.scripts.resolve, &record, wanted, |call| {
            call.arg(&response[..])
                .arg(self.options.retention_ms())
                .arg(&*self.channel);
        });
        let (answer, acknowledged) = resolve.await?;
        self.replicated(&record, acted(answer), acknowledged)
            .await?
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let mut connection = self.connection.clone();
        let record = self.record_key(key);
        let wanted = self.wanted(&record).await?;
        let call = async {
            let mut delete = redis::cmd("DEL");
            delete.arg(&record);
            let (deleted, acknowledged): (u64, Acknowledged) = match wanted {
                Wanted::Replicas(replicas, wait_ms) => {
                    // The delete and its wait on one connection, as the scripts' are.
                    let mut pipeline = redis::pipe();
                    pipeline.add_command(delete);
                    pipeline.cmd("WAIT").arg(replicas).arg(wait_ms);
                    let (deleted, acknowledged) = pipeline
                        .query_async(&mut connection)
                        .await
                        .map_err(unavailable)?;
                    (
                        deleted,
                        Acknowledged::By {
                            acknowledged,
                            replicas,
                        },
                    )
                }
                Wanted::Nothing | Wanted::Unknown => {
                    let deleted = delete
                        .query_async(&mut connection)
                        .await
                        .map_err(unavailable)?;
                    (deleted, Acknowledged::NotAsked)
                }
            };
            // Only a wake-up: a user without the right to publish still forgets.
            let published: redis::RedisResult<u64> = redis::cmd("PUBLISH")
                .arg(&*self.channel)
                .arg(&record)
                .query_async(&mut connection)
                .await;
            if let Err(error) = published {
                tracing::debug!(
                    error = &error as &dyn std::error::Error,
                    "publishing a forgotten key failed"
                );
            }
            Ok((deleted > 0, acknowledged))
        };
        let wait = match wanted {
            Wanted::Replicas(_, wait_ms) => Duration::from_millis(wait_ms),
            Wanted::Nothing | Wanted::Unknown => Duration::ZERO,
        };
        let (forgotten, acknowledged) =
            within(self.options.call_timeout().saturating_add(wait), call).await?;
        self.replicated(&record, forgotten, acknowledged).await
    }
}

/// The eviction policy of a set of primaries, from each one's (`None`: it does not say): the
/// first that may evict, else `None` if any does not say, else `noeviction`.
pub(super) fn loosest(policies: Vec<Option<String>>) -> Option<String> {
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
pub(super) async fn node_eviction_policy(
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
pub(super) fn config_value(reply: Value) -> Option<String> {
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
pub(super) fn glob_escape(text: &str) -> String {
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
