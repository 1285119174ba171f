//! [`Purger`]: a task of its own that deletes a durable store's expired records on a
//! schedule, so that nobody writes the loop by hand.

use std::future::Future;
use std::time::Duration;

use super::{StoreError, StoreErrorKind};

/// Deletes a store's expired records every interval, in a Tokio task of its own, until it is
/// dropped: made by `PostgresStore::purge_every` and
/// `SqliteStore::purge_every`. Keep it as long as the store serves.
///
/// Each run purges until nothing expired is left (in batches, so claims keep answering), then
/// waits the interval. What it removed is logged at `debug` (and `info` when it removed
/// anything), a failure at `warn`; a failed run is tried again at the next interval.
#[derive(Debug)]
#[must_use = "the purger stops when it is dropped"]
pub struct Purger {
    task: tokio::task::JoinHandle<()>,
}

impl Purger {
    /// Runs `purge` every `interval`, the first time at once. `interval` is at least a
    /// millisecond.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] outside a Tokio runtime: there is nothing to run the
    /// purger on.
    pub(crate) fn spawn<F, P>(interval: Duration, mut purge: P) -> Result<Self, StoreError>
    where
        P: FnMut() -> F + Send + 'static,
        F: Future<Output = Result<u64, StoreError>> + Send,
    {
        let interval = interval.max(Duration::from_millis(1));
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|error| StoreError::with_source(StoreErrorKind::InvalidConfig, error))?;
        let task = runtime.spawn(async move {
            loop {
                match purge().await {
                    Ok(0) => tracing::debug!("purge: nothing expired"),
                    Ok(removed) => tracing::info!(removed, "purge: expired records deleted"),
                    Err(error) => tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        "purge failed; trying again later"
                    ),
                }
                tokio::time::sleep(interval).await;
            }
        });
        Ok(Self { task })
    }
}

/// Stops purging. A run under way stops at its next await; the batches it finished stay
/// deleted.
impl Drop for Purger {
    fn drop(&mut self) {
        self.task.abort();
    }
}
