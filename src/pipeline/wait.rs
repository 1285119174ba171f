//! Waiting for a first attempt still running (the layer's `pending_wait`), and the timer it
//! and the renewals read.

use std::future::Future;
use std::panic;
use std::task::Poll;
use std::time::Duration;

use super::settle::{Pending, Unanswered, release};
use crate::config::Rules;
use crate::drain::Drain;
use crate::fingerprint::Fingerprint;
use crate::metrics::{Call, Started};
use crate::store::{Claim, Reservation, Store, StoreError};

tokio::task_local! {
    /// Set in the task a decision was handed to when its client went away: a request that
    /// waits for a first attempt stops waiting, since nobody would get its answer.
    pub(crate) static CLIENT_LEFT: ();
}

/// Whether the client of this decision went away.
pub(super) fn client_left() -> bool {
    CLIENT_LEFT.try_with(|()| ()).is_ok()
}

/// Waits up to `wait` for the first attempt at a pending key: looks again each time the
/// store says the key may have changed, and answers what the first claim that is not pending
/// answers (a replay, or the key anew if the first attempt was released), or pending when the
/// wait runs out, too many requests of the layer wait already, the client went away, or the
/// layer's drain closed (a key claimed anew for a client that left, or after the drain
/// closed, is released at once: nobody creates for it).
pub(super) async fn wait_for_first<St: Store>(
    store: &St,
    key: &str,
    fingerprint: &Fingerprint,
    reservation: Reservation,
    rules: &Rules,
    wait: Duration,
) -> Result<Claim, StoreError> {
    let Some(_slot) = rules.waiting.enter() else {
        return Ok(Claim::Pending);
    };
    let now = tokio::time::Instant::now();
    let deadline = now.checked_add(wait).unwrap_or(now + MAX_WAIT);
    // Without Tokio's timer there is no bounded wait: the immediate answer.
    let Some(timer) = tokio_timer(deadline, "a pending key is not waited for") else {
        return Ok(Claim::Pending);
    };
    let mut timer = std::pin::pin!(timer);
    let drain = rules.drain.as_ref();
    let mut closing = std::pin::pin!(async {
        match drain {
            Some(drain) => drain.closed().await,
            None => std::future::pending().await,
        }
    });
    let left = || rules.watch_client && client_left();
    let stop = || left() || drain.is_some_and(Drain::is_closed);
    loop {
        // Registered before the look, so a change right after it is not missed.
        let changed = store.changed(key);
        let started = Started::now();
        let pending = Pending::Claim(fingerprint);
        let mut unanswered = Unanswered::new(&rules.settling, store, key, reservation, pending);
        let answer = store
            .claim_with(key, fingerprint, reservation, rules.options.lease)
            .await;
        unanswered.answered();
        rules.metrics.store_call(Call::Claim, started);
        match answer {
            Ok(Claim::Pending) => {}
            Ok(Claim::New(reservation)) if stop() => {
                release(&rules.settling, store, key, &reservation).await;
                return Ok(Claim::Pending);
            }
            answer => return answer,
        }
        let mut changed = std::pin::pin!(changed);
        // Whether the key may have changed; not if the client left, the drain closed or the
        // deadline passed.
        let changed = std::future::poll_fn(|cx| {
            if left() || closing.as_mut().poll(cx).is_ready() || timer.as_mut().poll(cx).is_ready()
            {
                Poll::Ready(false)
            } else {
                changed.as_mut().poll(cx).map(|()| true)
            }
        })
        .await;
        if !changed {
            return Ok(Claim::Pending);
        }
    }
}

/// A Tokio timer until `deadline`, or `None` (and a warning that `without` follows) where
/// there is none: another executor, or a runtime built without `enable_time`, on which
/// creating one would panic.
pub(super) fn tokio_timer(
    deadline: tokio::time::Instant,
    without: &str,
) -> Option<tokio::time::Sleep> {
    let timer = tokio::runtime::Handle::try_current()
        .ok()
        .and_then(|_| panic::catch_unwind(|| tokio::time::sleep_until(deadline)).ok());
    if timer.is_none() {
        tracing::warn!("no Tokio timer: {without}");
    }
    timer
}

/// The longest wait for a first attempt: a longer one (up to `Duration::MAX`) is clamped.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
