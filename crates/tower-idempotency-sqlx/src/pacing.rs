//! How a SQL store's purge paces its batches ([`Pacing`]) and runs them ([`paced`]).

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use std::future::Future;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use tower_idempotency_core::StoreError;

/// How a SQL store's purge paces its batches, so that claims beside it keep most of the
/// database (on SQLite, of the file's write lock): after each batch it pauses four times as
/// long as the batch's statement took ([`pause`](Pacing::pause), from a millisecond up to
/// [`MAX_PURGE_PAUSE`]), and it sizes the next batch so that one takes about [`BATCH_TIME`]:
/// halved after a batch that took longer (down to [`MIN_PURGE_BATCH`]), doubled after one
/// that took under a quarter of it (up to the store's largest). So the purge takes about a
/// fifth of the database's time however fast the database deletes, and no batch holds its
/// rows, or the write lock, for long (the fifth holds for batches of up to a quarter of a
/// second, four times which is the longest pause). On PostgreSQL and SQLite a batch whose
/// statement timed out is tried again halved, and batches stay at most that large
/// ([`after_timeout`](Pacing::after_timeout)), until they are as small as they get.
#[derive(Debug)]
pub(crate) struct Pacing {
    batch: u64,
    largest: u64,
}

/// The longest pause between two batches of a SQL store's purge: four times a batch that took
/// a quarter of a second (a store's timeout is a second by default).
pub(crate) const MAX_PURGE_PAUSE: Duration = Duration::from_secs(1);

/// The time a SQL store's purge aims for each batch's statement to take.
pub(crate) const BATCH_TIME: Duration = Duration::from_millis(20);

/// The fewest records a SQL store's purge asks for in a batch.
pub(crate) const MIN_PURGE_BATCH: u64 = 100;

impl Pacing {
    /// Batches of at most `largest` records, the first that large.
    pub(crate) fn new(largest: u64) -> Self {
        let largest = largest.max(MIN_PURGE_BATCH);
        Self {
            batch: largest,
            largest,
        }
    }

    /// The records the next batch asks for: a batch that deletes fewer was the last.
    pub(crate) fn batch(&self) -> u64 {
        self.batch
    }

    /// After a batch whose statement took `took`: the pause before the next one, four times
    /// as long (within a millisecond and [`MAX_PURGE_PAUSE`]), and the next batch's size.
    pub(crate) fn pause(&mut self, took: Duration) -> Duration {
        if took > BATCH_TIME {
            self.halve();
        } else if took < BATCH_TIME / 4 {
            self.batch = self.batch.saturating_mul(2).min(self.largest);
        }
        four_times(took)
    }

    fn halve(&mut self) {
        self.batch = (self.batch / 2).max(MIN_PURGE_BATCH);
    }

    /// After a batch whose statement ran past `timeout`: the pause before it is tried again,
    /// halved, and never as large again; `None` when batches are as small as they get, and
    /// the purge gives up.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn after_timeout(&mut self, timeout: Duration) -> Option<Duration> {
        if self.batch <= MIN_PURGE_BATCH {
            return None;
        }
        self.halve();
        // Never as large again in this purge: the batch that timed out would time out again.
        self.largest = self.batch;
        Some(four_times(timeout))
    }
}

/// Four times `time`, within a millisecond and [`MAX_PURGE_PAUSE`]: a pause after it.
fn four_times(time: Duration) -> Duration {
    (time * 4).clamp(Duration::from_millis(1), MAX_PURGE_PAUSE)
}

/// A SQL store's purge, paced by [`Pacing`]: batches of at most `largest` records, each run by
/// `delete` (given how many records to ask for; it sets `sent` once its statement is sent,
/// and answers how many it deleted and how long the statement took), until one deletes fewer
/// than it asked for, each deletion added to `purged` as it comes. A batch that failed after
/// its statement was sent, with an error `retried` accepts (its statement ran past the
/// timeout, and was undone or leaves its rows to a later batch), is tried again halved; any
/// other failure ends the purge.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) async fn paced<F>(
    purged: &mut u64,
    largest: u64,
    timeout: Duration,
    retried: impl Fn(&StoreError) -> bool,
    sent: &AtomicBool,
    delete: impl Fn(i64) -> F,
) -> Result<(), StoreError>
where
    F: Future<Output = Result<(u64, Duration), StoreError>>,
{
    let mut pacing = Pacing::new(largest);
    loop {
        let asked = pacing.batch();
        sent.store(false, Ordering::Relaxed);
        let pause = match delete(i64::try_from(asked).unwrap_or(i64::MAX)).await {
            Ok((deleted, took)) => {
                *purged += deleted;
                if deleted < asked {
                    return Ok(());
                }
                // The claims beside it get four times the batch's time.
                pacing.pause(took)
            }
            // A timeout before the statement (no connection in time) is the pool's, and fails
            // the purge as it is.
            Err(error) if sent.load(Ordering::Relaxed) && retried(&error) => {
                pacing.after_timeout(timeout).ok_or(error)?
            }
            Err(error) => return Err(error),
        };
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A purge pauses four times its batch between batches, within a millisecond and the cap.
    #[test]
    fn a_purge_pauses_four_times_its_batch() {
        let ms = Duration::from_millis;
        let mut pacing = Pacing::new(5_000);
        assert_eq!(pacing.pause(ms(10)), ms(40));
        assert_eq!(pacing.pause(Duration::ZERO), ms(1));
        assert_eq!(pacing.pause(ms(30)), ms(120));
        assert_eq!(pacing.pause(ms(300)), MAX_PURGE_PAUSE);
    }

    /// A batch that takes long halves the next, down to the least; a quick one doubles it, up
    /// to the largest; one about the aim keeps it.
    #[test]
    fn a_purge_sizes_its_batches_by_their_time() {
        let ms = Duration::from_millis;
        let mut pacing = Pacing::new(5_000);
        assert_eq!(pacing.batch(), 5_000);
        pacing.pause(BATCH_TIME + ms(1));
        assert_eq!(pacing.batch(), 2_500);
        pacing.pause(BATCH_TIME);
        assert_eq!(pacing.batch(), 2_500, "at the aim: kept");
        pacing.pause(BATCH_TIME / 4);
        assert_eq!(pacing.batch(), 2_500, "a quarter of the aim: kept");
        pacing.pause(BATCH_TIME / 4 - ms(1));
        assert_eq!(pacing.batch(), 5_000);
        pacing.pause(Duration::ZERO);
        assert_eq!(pacing.batch(), 5_000, "never above the largest");
        for _ in 0..20 {
            pacing.pause(ms(500));
        }
        assert_eq!(pacing.batch(), MIN_PURGE_BATCH, "never below the least");
        assert_eq!(Pacing::new(10).batch(), MIN_PURGE_BATCH);
    }

    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    /// A batch that timed out is tried again halved, after four times the timeout (within the
    /// cap), until batches are as small as they get.
    #[test]
    fn a_timed_out_batch_is_tried_again_halved_down_to_the_least() {
        let ms = Duration::from_millis;
        let mut pacing = Pacing::new(400);
        assert_eq!(pacing.after_timeout(ms(100)), Some(ms(400)));
        assert_eq!(pacing.batch(), 200);
        pacing.pause(Duration::ZERO);
        assert_eq!(pacing.batch(), 200, "not grown back to what timed out");
        assert_eq!(
            pacing.after_timeout(Duration::from_secs(1)),
            Some(MAX_PURGE_PAUSE)
        );
        assert_eq!(pacing.batch(), MIN_PURGE_BATCH);
        assert_eq!(pacing.after_timeout(ms(100)), None, "the least: given up");
        assert_eq!(pacing.batch(), MIN_PURGE_BATCH);
        let mut pacing = Pacing::new(150);
        assert_eq!(pacing.after_timeout(Duration::ZERO), Some(ms(1)));
        assert_eq!(
            pacing.batch(),
            MIN_PURGE_BATCH,
            "halved, not below the least"
        );
    }
}
