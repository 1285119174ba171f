//! Settling store calls whose answer was lost, so that no reservation nobody holds is left
//! behind: a lost claim undone, a lost release or complete repeated, an unfinished create
//! abandoned.

use std::time::Duration;

use crate::drain::Drain;
use crate::fingerprint::Fingerprint;
use crate::metrics::{Call, Started};
use crate::scope::KeyBuf;
use crate::store::{Reservation, Store, StoreError, StoreErrorKind, StoredResponse};
use crate::tally::Tally;

/// Whether a failed store call may still have taken effect: its answer was lost.
pub(super) fn is_unknown(error: &StoreError) -> bool {
    matches!(
        error.kind(),
        StoreErrorKind::Timeout | StoreErrorKind::Unavailable
    )
}

/// When a call whose outcome is unknown is settled: soon after, then every second for about
/// half a minute, so a store that recovers within that settles every key it was asked about
/// within a second of recovering, then every five seconds until [`SETTLE_FOR`] has passed, so
/// that a store away for longer (a failover on a loaded host, a restart) still leaves no key
/// pending.
pub(super) fn settle_delays() -> impl Iterator<Item = Duration> {
    [50, 100, 200, 400]
        .into_iter()
        .chain(std::iter::repeat_n(1_000, 30))
        .chain(std::iter::repeat(5_000))
        .map(Duration::from_millis)
}

/// How long a settling tries, from its start, however long each try takes (a store cut off
/// answers each only at its timeout): five minutes. A try is not started after it.
pub(super) const SETTLE_FOR: Duration = Duration::from_secs(300);

/// What a settling task does with a reservation whose call's answer was lost.
pub(super) enum Settle {
    /// A claim: undo it, after it.
    Claim(Fingerprint),
    /// A release: release again.
    Release,
    /// A complete: complete again.
    Complete(StoredResponse),
}

/// Settles, in a task of its own, a call on `reservation` whose answer was lost, so that no
/// reservation nobody holds is left behind. A lost claim is undone by the store
/// ([`Store::settle_claim`]: after the lost claim, whatever it did). A lost release or
/// complete is repeated; `ReservationLost` means it took effect already. Each attempt that
/// fails is tried again.
///
/// The layer's drain, if any, counts the task: a shutdown waits for it as for the request.
pub(super) fn settle<St: Store>(
    settling: &Tally,
    store: St,
    key: String,
    reservation: Reservation,
    what: Settle,
) {
    // A bound on the layer's tasks at once, so that a long outage under load cannot pile
    // them up (each holds a key and maybe a response, and calls the store every second or
    // five, for up to five minutes); one layer's outage takes no place of another's.
    let Some(slot) = settling.enter_owned() else {
        tracing::error!("too many lost store answers being settled; this key may stay pending");
        return;
    };
    let held = settling.drain().map(Drain::hold);
    let settling = async move {
        let _slot = slot;
        let _held = held;
        let deadline = tokio::time::Instant::now() + SETTLE_FOR;
        for delay in settle_delays() {
            // No try starts past the deadline, and none is waited for past it.
            if tokio::time::Instant::now() + delay > deadline {
                break;
            }
            tokio::time::sleep(delay).await;
            let result = match &what {
                Settle::Claim(fingerprint) => {
                    store.settle_claim(&key, fingerprint, reservation).await
                }
                Settle::Release => store.release(&key, &reservation).await,
                Settle::Complete(response) => store.complete(&key, &reservation, response).await,
            };
            match result {
                Ok(()) => return,
                // Final: another holds the reservation now, or the transaction of a
                // transactional store ended (committed or rolled back with its writes), which
                // no repetition changes.
                Err(error)
                    if matches!(
                        error.kind(),
                        StoreErrorKind::ReservationLost
                            | StoreErrorKind::Uncommitted
                            | StoreErrorKind::CommitUnknown
                    ) =>
                {
                    return;
                }
                Err(error) => tracing::debug!(
                    error = &error as &dyn std::error::Error,
                    "settling a lost store answer; trying again"
                ),
            }
        }
        tracing::error!("a lost store answer could not be settled; the key may stay pending");
    };
    super::spawn_or_log(settling, "a lost store answer is not settled");
}

/// Deletes a reservation: after a confirmed admission refusal, or an unstored response. If
/// its answer is lost, it is settled later; any other failure leaves the key pending, which
/// is safe.
pub(super) async fn release<St: Store>(
    settling: &Tally,
    store: &St,
    key: &str,
    reservation: &Reservation,
) {
    let started = Started::now();
    let mut unanswered = Unanswered::new(settling, store, key, *reservation, Pending::Release);
    let released = store.release(key, reservation).await;
    unanswered.answered();
    settling.metrics().store_call(Call::Release, started);
    if let Err(error) = released {
        tracing::warn!(
            error = &error as &dyn std::error::Error,
            "release failed; settling it"
        );
        if is_unknown(&error) {
            settle(
                settling,
                store.clone(),
                key.to_owned(),
                *reservation,
                Settle::Release,
            );
        }
    }
}

/// A new reservation not yet completed, released or abandoned: if its decision unwinds or is
/// dropped while armed, [`Store::abandon`] runs in a task of its own, so that a transactional
/// store rolls back rather than keep its transaction open.
pub(super) struct Unsettled<'a, St: Store> {
    pub(super) store: &'a St,
    pub(super) key: &'a KeyBuf,
    pub(super) reservation: &'a Reservation,
    pub(super) armed: bool,
}

impl<St: Store> Drop for Unsettled<'_, St> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, key, reservation) = (
            self.store.clone(),
            self.key.as_str().to_owned(),
            *self.reservation,
        );
        super::spawn_or_log(
            async move { store.abandon(&key, &reservation).await },
            "an unfinished create is not abandoned",
        );
    }
}

/// A store call in flight: should its decision be dropped before the store answers (a caller
/// that cancels a run, a timeout around it), what the call may have done is settled in a task
/// of its own, as a lost answer is, rather than left for a lease to lapse.
pub(super) struct Unanswered<'a, St: Store> {
    settling: &'a Tally,
    store: &'a St,
    key: &'a str,
    reservation: Reservation,
    call: Option<Pending<'a>>,
}

/// The call an [`Unanswered`] stands for.
pub(super) enum Pending<'a> {
    /// A claim: released if it took effect.
    Claim(&'a Fingerprint),
    /// A complete: repeated.
    Complete(&'a StoredResponse),
    /// A release: repeated.
    Release,
    /// An abandon: repeated.
    Abandon,
}

impl<'a, St: Store> Unanswered<'a, St> {
    pub(super) fn new(
        settling: &'a Tally,
        store: &'a St,
        key: &'a str,
        reservation: Reservation,
        call: Pending<'a>,
    ) -> Self {
        Self {
            settling,
            store,
            key,
            reservation,
            call: Some(call),
        }
    }

    /// The store answered: nothing to settle here.
    pub(super) fn answered(&mut self) {
        self.call = None;
    }
}

impl<St: Store> Drop for Unanswered<'_, St> {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let (store, key, reservation) = (self.store.clone(), self.key.to_owned(), self.reservation);
        let what = match call {
            Pending::Claim(fingerprint) => Settle::Claim(*fingerprint),
            Pending::Complete(stored) => Settle::Complete(stored.clone()),
            Pending::Release => Settle::Release,
            Pending::Abandon => {
                super::spawn_or_log(
                    async move { store.abandon(&key, &reservation).await },
                    "an unfinished create is not abandoned",
                );
                return;
            }
        };
        settle(self.settling, store, key, reservation, what);
    }
}
