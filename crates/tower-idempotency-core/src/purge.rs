//! Purging: [`Purge`], the trait of the stores whose expired records someone must delete,
//! and [`Purger`], a task of its own that purges one on a schedule, so that nobody writes the
//! loop by hand.
//!
//! The SQL stores and the memory store purge. Redis needs no purge: it deletes each completed
//! record itself when its time to live ends.
use std::future::Future;
use std::time::Duration;

use crate::{Store, StoreError, StoreErrorKind};

/// A store whose completed records past their retention stay until they are deleted: this
/// deletes them. Pending records are never deleted. As tower-sessions' `ExpiredDeletion`.
///
/// Implemented by every store that purges: the SQL stores (`PostgresStore`, `MySqlStore`,
/// `SqliteStore`), in batches, so that a purge finishes at any backlog and claims keep
/// answering beside it (each batch sized to take about 20 ms, and followed by a pause four
/// times as long: the purge takes about a fifth of the database's time; on PostgreSQL and
/// SQLite a batch that times out is tried again halved), and
/// [`MemoryStore`](https://docs.rs/tower-idempotency/latest/tower_idempotency/store/struct.MemoryStore.html), in one pass bounded by its record cap. A store of your own implements
/// [`purge_expired_counting`](Purge::purge_expired_counting) and gets the rest.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency_core::Purge;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_idempotency_core::StoreError> {
/// let store = MemoryStore::new();
/// assert_eq!(store.purge_expired().await?, 0);
/// let purger = store.purge_every(Duration::from_secs(3600))?;
/// // … serve; the purger stops when dropped.
/// # drop(purger);
/// # Ok(()) }
/// ```
pub trait Purge: Store {
    /// Deletes the completed records past their retention (on a store that keeps tombstones:
    /// drops the response of those within their tombstone window, which count as purged, and
    /// deletes those past it), adding each batch's deletions to
    /// `purged` as it goes: after a failure it holds what the batches before it deleted.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the backend cannot be reached or refuses; the records of the
    /// batches before it stay deleted.
    fn purge_expired_counting(
        &self,
        purged: &mut u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Purges the completed records past their retention (see
    /// [`purge_expired_counting`](Purge::purge_expired_counting)), and returns how many.
    ///
    /// # Errors
    ///
    /// As [`purge_expired_counting`](Purge::purge_expired_counting).
    fn purge_expired(&self) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async move {
            let mut purged = 0;
            self.purge_expired_counting(&mut purged).await?;
            Ok(purged)
        }
    }

    /// Purges every `interval` ([`purge_expired`](Purge::purge_expired)), the first time at
    /// once, in a task of its own, until the returned [`Purger`] is dropped: keep it for as
    /// long as the store serves (bound to a name: `let _ = …` drops it at once, and the purge
    /// with it). On a shared store, one replica's purger is enough; more share the work.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidConfig`] outside a Tokio runtime.
    fn purge_every(&self, interval: Duration) -> Result<Purger, StoreError> {
        let store = self.clone();
        Purger::spawn(interval, move || {
            let store = store.clone();
            async move { store.purge_expired().await }
        })
    }
}

/// Deletes a store's expired records every interval, in a Tokio task of its own, until it is
/// dropped: made by [`Purge::purge_every`]. Keep it as long as the store serves.
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
    pub fn spawn<F, P>(interval: Duration, mut purge: P) -> Result<Self, StoreError>
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
