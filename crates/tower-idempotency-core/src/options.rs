//! [`StoreOptions`]: what every store is configured with, one type for all of them.

use std::time::Duration;

use crate::backend::retention_millis;
use crate::{DEFAULT_RETENTION, DEFAULT_TIMEOUT, DEFAULT_TOMBSTONES};

/// What every store is configured with: how long a completed record is replayed, how long its
/// tombstone is kept after that, and how long one store call may take. One value type for
/// every store, built once and handed to each store's `with_options` (the memory store's
/// builder takes it with `options`); a store's `retention`, `tombstones`, `keep_forever` and
/// `timeout` methods are shorthands that set one field of it.
/// An application names it `tower_idempotency::store::StoreOptions`.
///
/// It is a plain value: changing it changes nothing already built. A store whose own pool
/// carries the timeout to the server (a `statement_timeout`, a lock wait) makes the pool
/// afresh for new options rather than changing the one its clones share; that pool connects
/// on first use, so `connect(url).await?.with_options(options)` makes its connections once,
/// with the options' timeout (`connect` checks the server on a connection of its own).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_core::StoreOptions;
///
/// let options = StoreOptions::new()
///     .retention(Duration::from_secs(3600))
///     .timeout(Duration::from_millis(500));
/// assert_eq!(options.retention_window(), Some(Duration::from_secs(3600)));
/// assert_eq!(options.call_timeout(), Duration::from_millis(500));
/// assert_eq!(options.retention_ms(), 3_600_000);
///
/// let forever = options.keep_forever();
/// assert_eq!(forever.retention_window(), None);
/// assert_eq!(forever.retention_ms(), 0);
/// assert_eq!(StoreOptions::default(), StoreOptions::new());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    retention: Option<Duration>,
    tombstones: Duration,
    timeout: Duration,
}

impl StoreOptions {
    /// The defaults: [`DEFAULT_RETENTION`] (24 hours), [`DEFAULT_TOMBSTONES`] (seven days)
    /// and [`DEFAULT_TIMEOUT`] (one second).
    pub const fn new() -> Self {
        Self {
            retention: Some(DEFAULT_RETENTION),
            tombstones: DEFAULT_TOMBSTONES,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Once a completed record's replay window passed, the store keeps its
    /// [`Tombstone`](crate::Tombstone) (when it completed, its status and `Location`: the key
    /// and a dozen bytes more) for `tombstones` more, and answers a claim with the same
    /// fingerprint [`Claim::Expired`](crate::Claim::Expired) rather than create again; past
    /// that, the key is new. `Duration::ZERO` keeps none: a key past its replay window is new
    /// at once. Default [`DEFAULT_TOMBSTONES`]. Stores that keep tombstones say so with
    /// [`Store::tombstone_window`](crate::Store::tombstone_window) (the memory store and
    /// the SQL stores; Redis keeps none yet).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency_core::{DEFAULT_TOMBSTONES, StoreOptions};
    ///
    /// assert_eq!(StoreOptions::new().tombstone_window(), Some(DEFAULT_TOMBSTONES));
    /// let off = StoreOptions::new().tombstones(Duration::ZERO);
    /// assert_eq!(off.tombstone_window(), None);
    /// // Records kept for good are never tombstoned.
    /// assert_eq!(StoreOptions::new().keep_forever().tombstone_window(), None);
    /// ```
    #[must_use]
    pub const fn tombstones(mut self, tombstones: Duration) -> Self {
        self.tombstones = tombstones;
        self
    }

    /// How long a completed operation is remembered once its replay window passed; `None`
    /// when it is not (no tombstones, or records kept for good).
    pub const fn tombstone_window(&self) -> Option<Duration> {
        if self.retention.is_none() || self.tombstones.is_zero() {
            None
        } else {
            Some(self.tombstones)
        }
    }

    /// Completed records are replayed for `retention` after they were completed; from then on
    /// a store that keeps tombstones ([`tombstones`](Self::tombstones)) answers a retry as
    /// expired until the tombstone window ends, and otherwise a claim treats them as absent;
    /// the store's purge drops what it no longer needs. Pending records never expire. Any duration is accepted; a remote store clamps it to
    /// [`MAX_RETENTION`](crate::MAX_RETENTION) (a hundred years).
    #[must_use]
    pub const fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Completed records are kept until they are forgotten, rather than for a retention
    /// window: the store then grows with every key it is sent.
    #[must_use]
    pub const fn keep_forever(mut self) -> Self {
        self.retention = None;
        self
    }

    /// One store call may take `timeout`, any wait for a connection included; past it the call
    /// fails with [`StoreErrorKind::Timeout`](crate::StoreErrorKind::Timeout).
    #[must_use]
    pub const fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long completed records are replayed; `None` when they are kept until forgotten.
    pub const fn retention_window(&self) -> Option<Duration> {
        self.retention
    }

    /// How long one store call may take.
    pub const fn call_timeout(&self) -> Duration {
        self.timeout
    }

    /// The retention as remote stores keep it: whole milliseconds from one to
    /// [`MAX_RETENTION`](crate::MAX_RETENTION)'s, or `0` for records kept until forgotten.
    pub fn retention_ms(&self) -> u64 {
        self.retention.map_or(0, retention_millis)
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_RETENTION;

    #[test]
    fn each_setter_changes_its_own_field_only() {
        let base = StoreOptions::new();
        let retained = base.retention(Duration::from_secs(5));
        assert_eq!(retained.call_timeout(), DEFAULT_TIMEOUT);
        assert_eq!(retained.retention_window(), Some(Duration::from_secs(5)));
        let timed = base.timeout(Duration::from_secs(7));
        assert_eq!(timed.retention_window(), Some(DEFAULT_RETENTION));
        assert_eq!(timed.call_timeout(), Duration::from_secs(7));
        let again = base.keep_forever().retention(Duration::from_secs(1));
        assert_eq!(again.retention_window(), Some(Duration::from_secs(1)));
        let stones = base.tombstones(Duration::from_secs(9));
        assert_eq!(stones.tombstone_window(), Some(Duration::from_secs(9)));
        assert_eq!(stones.retention_window(), Some(DEFAULT_RETENTION));
        assert_eq!(stones.call_timeout(), DEFAULT_TIMEOUT);
        assert_eq!(timed.tombstone_window(), Some(DEFAULT_TOMBSTONES));
        // None without a replay window, or without tombstones, and only then.
        assert_eq!(stones.keep_forever().tombstone_window(), None);
        assert_eq!(base.tombstones(Duration::ZERO).tombstone_window(), None);
    }

    #[test]
    fn the_retention_in_milliseconds_is_clamped_and_never_zero_unless_forever() {
        let options = StoreOptions::new();
        assert_eq!(options.retention_ms(), 24 * 3600 * 1000);
        assert_eq!(options.retention(Duration::ZERO).retention_ms(), 1);
        assert_eq!(
            options.retention(Duration::MAX).retention_ms(),
            retention_millis(MAX_RETENTION)
        );
        assert_eq!(options.keep_forever().retention_ms(), 0);
    }
}
