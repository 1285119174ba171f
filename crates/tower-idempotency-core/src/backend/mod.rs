//! Helpers for the backend of a store of your own, the ones the built-in remote stores use:
//! bounding a call by the store's timeout ([`within`]), a retention in the milliseconds
//! backends keep ([`retention_millis`]), and waking the requests that wait for a key
//! ([`waiting`] for a store whose changes this process makes, [`notifier`] for one whose
//! backend announces them to every replica).

use std::future::Future;
use std::time::Duration;

use crate::{MAX_RETENTION, StoreError, StoreErrorKind};

pub mod notifier;
pub mod waiting;

/// Runs one remote store call, failing with [`StoreErrorKind::Timeout`] past `timeout`.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_core::StoreErrorKind;
/// use tower_idempotency_core::backend::within;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let slow = within(Duration::from_millis(1), async {
///     tokio::time::sleep(Duration::from_secs(5)).await;
///     Ok(())
/// });
/// assert_eq!(slow.await.unwrap_err().kind(), StoreErrorKind::Timeout);
/// # }
/// ```
///
/// # Errors
///
/// The call's own error, or [`StoreErrorKind::Timeout`] past `timeout`.
pub async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(StoreError::new(StoreErrorKind::Timeout)))
}

/// A retention window in whole milliseconds, at least one and at most [`MAX_RETENTION`], as
/// remote stores keep it.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_core::backend::retention_millis;
///
/// assert_eq!(retention_millis(Duration::from_secs(2)), 2_000);
/// assert_eq!(retention_millis(Duration::ZERO), 1);
/// assert_eq!(retention_millis(Duration::MAX), retention_millis(tower_idempotency_core::MAX_RETENTION));
/// ```
pub fn retention_millis(retention: Duration) -> u64 {
    let millis = retention.min(MAX_RETENTION).as_millis();
    u64::try_from(millis).unwrap_or(u64::MAX).max(1)
}
