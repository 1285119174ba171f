//! The server's clock as the store knows it: its offset from this host's, read off the claims'
//! answers, so that a claim's write carries a deadline on the server's clock counted from when
//! this host sent it (not from when the server began it, which a lock or a slow network can
//! delay past the caller's timeout).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A sample is taken only from an answer that came back within this: the offset it gives is
/// then off by half of it at most, which the settling's margin covers.
const TRUSTED_ROUND_TRIP_US: i64 = 200_000;

/// Not known yet.
const UNKNOWN: i64 = i64::MIN;

/// The server's clock minus this host's, in microseconds, as last measured.
#[derive(Debug)]
pub(super) struct ServerClock {
    offset_us: AtomicI64,
}

impl Default for ServerClock {
    fn default() -> Self {
        Self {
            offset_us: AtomicI64::new(UNKNOWN),
        }
    }
}

/// Now on this host's clock, in microseconds since the Unix epoch.
pub(super) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        })
}

impl ServerClock {
    /// A statement sent at `sent_us` and answered at `received_us` (this host's clock) read
    /// the server's clock as `server_us` in between.
    pub(super) fn sample(&self, sent_us: i64, received_us: i64, server_us: i64) {
        let round_trip = received_us.saturating_sub(sent_us);
        if (0..=TRUSTED_ROUND_TRIP_US).contains(&round_trip) {
            let midpoint = sent_us.saturating_add(round_trip / 2);
            let offset = server_us.saturating_sub(midpoint);
            // Never the marker of an unknown offset.
            self.offset_us
                .store(offset.max(UNKNOWN + 1), Ordering::Relaxed);
        }
    }

    /// The server's time, in microseconds since the epoch, `timeout` after a statement sent at
    /// `sent_us` on this host's clock; `None` while no sample was taken.
    pub(super) fn deadline(&self, sent_us: i64, timeout: Duration) -> Option<i64> {
        let offset = self.offset_us.load(Ordering::Relaxed);
        if offset == UNKNOWN {
            return None;
        }
        let timeout = i64::try_from(timeout.as_micros()).unwrap_or(i64::MAX);
        Some(sent_us.saturating_add(offset).saturating_add(timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offset is read off an answer's midpoint, only from a quick one; the deadline is the
    /// send time, moved to the server's clock, plus the timeout.
    #[test]
    fn a_quick_answer_sets_the_offset_and_the_deadline_follows_it() {
        let clock = ServerClock::default();
        let second = Duration::from_secs(1);
        assert_eq!(clock.deadline(1_000_000, second), None);
        // A slow answer teaches nothing.
        clock.sample(0, TRUSTED_ROUND_TRIP_US + 1, 5_000_000);
        assert_eq!(clock.deadline(1_000_000, second), None);
        // Sent at 10 s, answered at 10.1 s, the server read 15.05 s: 5 s ahead.
        clock.sample(10_000_000, 10_100_000, 15_050_000);
        assert_eq!(clock.deadline(20_000_000, second), Some(26_000_000));
        // A round trip of exactly the bound is trusted; a backwards one is not.
        clock.sample(0, TRUSTED_ROUND_TRIP_US, 100_000);
        assert_eq!(clock.deadline(0, second), Some(1_000_000));
        clock.sample(10, 0, 99_999_999);
        assert_eq!(clock.deadline(0, second), Some(1_000_000));
        // A server far behind is still an offset, never the unknown one.
        clock.sample(0, 0, i64::MIN);
        assert!(clock.deadline(0, second).is_some());
    }

    #[test]
    fn now_is_after_the_crate_was_written() {
        assert!(now_us() > 1_700_000_000_000_000);
    }
}
