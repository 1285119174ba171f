//! The decision, whatever runs it: claim (and wait for a first attempt), run the work under a
//! renewed lease, complete or release or abandon, settle what the store's answer left unknown.
//! The layer's services ([`Validated::run`](super::Validated::run)) and the function API
//! ([`Idempotent`](crate::Idempotent)) run this one implementation; each brings its work and
//! reads the decision's answer its own way (a response, a typed result).

use std::future::Future;

use super::futures::renewing;
use super::settle::{Pending, Settle, Unanswered, Unsettled, is_unknown, release, settle};
use super::wait::wait_for_first;
use crate::config::Rules;
use crate::metrics::{Call, Started};
use crate::operation::Fingerprint;
use crate::reply::Outcome;
use crate::scope::KeyBuf;
use crate::store::{
    Claim, Reservation, Store, StoreError, StoreErrorKind, StoredResponse, Tombstone,
};
use crate::tally::Tally;

/// A claim's answer when it is not a new claim: no work runs.
#[derive(Debug)]
pub(crate) enum Answered {
    /// The key was completed: its stored response.
    Replay(StoredResponse),
    /// Another attempt holds the key.
    Pending,
    /// The key belongs to another fingerprint.
    Conflict,
    /// The key's operation completed and its replay window passed: what the store remembers.
    Expired(Tombstone),
    /// The store failed to answer; nothing ran (a lost claim is settled).
    StoreUnavailable,
}

/// Where the decision's claim starts.
#[derive(Clone, Copy)]
pub(crate) enum First {
    /// From the start: the store answers only by waiting.
    Claim,
    /// Claimed already, new.
    New,
    /// Claimed already and pending: wait for the first attempt.
    Wait,
}

/// What follows work that ends without a result to store.
pub(crate) enum Then {
    /// Release the key: nothing was done (a confirmed refusal, or work that says so).
    Release,
    /// Leave the key to the store ([`Store::abandon`]): the work may have taken effect.
    Abandon,
}

/// The result of work that completes its key: what is stored.
pub(crate) trait Completed {
    /// The record the key is completed with.
    fn stored(&self) -> &StoredResponse;
}

/// How a decision ended.
pub(crate) enum Decided<R, E> {
    /// The claim answered; no work ran.
    Answered(Answered),
    /// The work ran and its result was completed: [`Outcome::Created`],
    /// [`Outcome::CompleteFailed`] (settled later), or [`Outcome::StoreUnavailable`] (a
    /// transaction that did not commit: the work's writes went with it).
    Done(R, Outcome),
    /// The work ended without a result to store; its key was released or abandoned.
    Unstored(E),
}

/// Step 4 at once, where the store answers without waiting ([`Store::claim_now`]): the
/// decision's start and its reservation, or the answer. A store that must wait leaves the
/// claim to the decision ([`First::Claim`]).
// The answer moves once, into the caller's next state: boxing it would cost an allocation per
// replay.
#[allow(clippy::result_large_err)]
pub(crate) fn claim_now<St: Store>(
    store: &St,
    key: &str,
    fingerprint: &Fingerprint,
    reservation: Reservation,
    rules: &Rules,
) -> Result<(First, Reservation), Answered> {
    let started = Started::now();
    let Some(answer) = store.claim_now(key, fingerprint, reservation, rules.options.lease) else {
        return Ok((First::Claim, reservation));
    };
    rules.metrics.store_call(Call::Claim, started);
    if let (Ok(Claim::Pending), Some(_)) = (&answer, rules.options.pending_wait) {
        return Ok((First::Wait, reservation));
    }
    answered(answer, store, key, fingerprint, reservation, rules)
        .map(|reservation| (First::New, reservation))
}

/// What a decision holds for its whole life, and lends to its work: the store, the key, the
/// fingerprint, the rules.
pub(crate) trait Host {
    type Store: Store;
    fn store(&self) -> &Self::Store;
    fn key(&self) -> &KeyBuf;
    fn fingerprint(&self) -> &Fingerprint;
    fn rules(&self) -> &Rules;
}

/// The work a new claim runs, and how its decision is answered: the layer's admission, create
/// and response read whole, or a function's call.
pub(crate) trait Work<H>: Sized {
    /// A result to complete the key with.
    type Done: Completed;
    /// A result that is not stored.
    type Unstored;
    /// The decision's answer.
    type Output;

    /// Runs the work of the new claim `reservation`: its result, or what is not stored and
    /// what becomes of the key.
    fn run<'a>(
        &'a mut self,
        host: &'a H,
        reservation: Reservation,
    ) -> impl Future<Output = Result<Self::Done, (Self::Unstored, Then)>> + 'a;

    /// The answer to the decision.
    fn answer(self, host: &H, decided: Decided<Self::Done, Self::Unstored>) -> Self::Output;
}

/// Steps 4 (unless the claim was made at once) to 8: claim, then the work under a lease
/// renewed as it goes, then complete its result, or release or abandon the key as it says;
/// the work answers.
///
/// The decision owns its host and its work, each held once in its state, and lends them to
/// the steps.
// An `async fn` binds its arguments anew in its state, beside the captures: the host and the
// work would each be held twice (measured: 944 bytes against 1,424 for a created request).
#[allow(clippy::manual_async_fn)]
pub(crate) fn decide<H: Host, W: Work<H>>(
    host: H,
    mut work: W,
    first: First,
    mut reservation: Reservation,
) -> impl Future<Output = W::Output> {
    async move {
        if !matches!(first, First::New) {
            let (store, key) = (host.store(), host.key().as_str());
            match claim(
                store,
                key,
                host.fingerprint(),
                reservation,
                host.rules(),
                first,
            )
            .await
            {
                Ok(held) => reservation = held,
                Err(answer) => return work.answer(&host, Decided::Answered(answer)),
            }
        }
        let (store, key, rules) = (host.store(), host.key(), host.rules());
        // Until the reservation is completed, released or abandoned below, a decision that
        // unwinds or is dropped abandons it.
        let mut unsettled = Unsettled {
            store,
            key,
            reservation: &reservation,
            armed: true,
        };
        let lease = rules.options.lease.duration();
        let ended = renewing(
            work.run(&host, reservation),
            store,
            key.as_str(),
            &reservation,
            lease,
            &rules.metrics,
        )
        .await;
        unsettled.armed = false;
        let decided = conclude(ended, store, key.as_str(), &reservation, &rules.settling).await;
        work.answer(&host, decided)
    }
}

/// Step 8, or what follows work that ended without a result to store: complete, or settle the
/// reservation (release or abandon it). One await either way, with the work's result held in
/// one place while it runs.
#[allow(clippy::manual_async_fn)] // an `async fn` would hold `ended` twice (see the module)
fn conclude<'a, St: Store, R: Completed + 'a, E: 'a>(
    ended: Result<R, (E, Then)>,
    store: &'a St,
    key: &'a str,
    reservation: &'a Reservation,
    settling: &'a Tally,
) -> impl Future<Output = Decided<R, E>> + 'a {
    async move {
        let outcome = match &ended {
            Ok(done) => complete(settling, store, key, reservation, done.stored()).await,
            Err((_, then)) => {
                match then {
                    Then::Release => release(settling, store, key, reservation).await,
                    Then::Abandon => {
                        let pending = Pending::Abandon;
                        let mut unanswered =
                            Unanswered::new(settling, store, key, *reservation, pending);
                        store.abandon(key, reservation).await;
                        unanswered.answered();
                    }
                }
                // Not read: the unstored result carries its own.
                Outcome::Unstored
            }
        };
        match ended {
            Ok(done) => Decided::Done(done, outcome),
            Err((unstored, _)) => Decided::Unstored(unstored),
        }
    }
}

/// Step 4: the claim decides; only a new claim goes on, with its reservation.
/// The reservation is chosen before the claim: if the claim's answer is lost, the claim may
/// still take effect, and releasing the reservation settles it.
async fn claim<St: Store>(
    store: &St,
    key: &str,
    fingerprint: &Fingerprint,
    reservation: Reservation,
    rules: &Rules,
    first: First,
) -> Result<Reservation, Answered> {
    let mut answer = match first {
        First::New => return Ok(reservation),
        First::Wait => Ok(Claim::Pending),
        First::Claim => {
            let started = Started::now();
            let pending = Pending::Claim(fingerprint);
            let mut unanswered = Unanswered::new(&rules.settling, store, key, reservation, pending);
            let answer = store
                .claim_with(key, fingerprint, reservation, rules.options.lease)
                .await;
            unanswered.answered();
            rules.metrics.store_call(Call::Claim, started);
            answer
        }
    };
    if let (Ok(Claim::Pending), Some(wait)) = (&answer, rules.options.pending_wait) {
        // Boxed: the wait is rare and its future large, and every decision's state would
        // otherwise hold room for it.
        answer = Box::pin(wait_for_first(
            store,
            key,
            fingerprint,
            reservation,
            rules,
            wait,
        ))
        .await;
    }
    answered(answer, store, key, fingerprint, reservation, rules)
}

/// The claim's answer: a new claim's reservation, or the answer. A failure whose outcome is
/// unknown is settled in a task of its own.
// As `claim_now`: the answer moves once.
#[allow(clippy::result_large_err)]
fn answered<St: Store>(
    answer: Result<Claim, StoreError>,
    store: &St,
    key: &str,
    fingerprint: &Fingerprint,
    reservation: Reservation,
    rules: &Rules,
) -> Result<Reservation, Answered> {
    match answer {
        Ok(Claim::New(reservation)) => Ok(reservation),
        Ok(Claim::Replay(stored)) => Err(Answered::Replay(stored)),
        Ok(Claim::Pending) => Err(Answered::Pending),
        Ok(Claim::Conflict) => Err(Answered::Conflict),
        Ok(Claim::Expired(tombstone)) => Err(Answered::Expired(tombstone)),
        Err(error) => {
            tracing::warn!(
                error = &error as &dyn std::error::Error,
                "claim failed; nothing created"
            );
            // A claim no replica confirmed was undone on the primary alone: a replica that
            // holds the claim may be promoted before the undo reaches it, so it is settled as
            // a lost claim is (the settling waits for a replica).
            if is_unknown(&error) || error.kind() == StoreErrorKind::Unreplicated {
                settle(
                    &rules.settling,
                    store.clone(),
                    key.to_owned(),
                    reservation,
                    Settle::Claim(*fingerprint),
                );
            }
            Err(Answered::StoreUnavailable)
        }
    }
}

/// Step 8: the complete, before the answer is given. If its answer is lost, it is repeated
/// later with the same reservation, so the key ends completed, not pending. A transaction that
/// did not commit ([`StoreErrorKind::Uncommitted`]) is [`Outcome::StoreUnavailable`]: the
/// work's writes went with it; one whose commit went unanswered
/// ([`StoreErrorKind::CommitUnknown`]) is [`Outcome::Unknown`]: they may have committed.
async fn complete<St: Store>(
    settling: &Tally,
    store: &St,
    key: &str,
    reservation: &Reservation,
    stored: &StoredResponse,
) -> Outcome {
    let started = Started::now();
    let pending = Pending::Complete(stored);
    let mut unanswered = Unanswered::new(settling, store, key, *reservation, pending);
    let completed = store.complete(key, reservation, stored).await;
    unanswered.answered();
    settling.metrics().store_call(Call::Complete, started);
    match completed {
        Ok(()) => Outcome::Created,
        Err(error) if error.kind() == StoreErrorKind::Uncommitted => {
            tracing::error!(
                error = &error as &dyn std::error::Error,
                "the create's transaction did not commit"
            );
            Outcome::StoreUnavailable
        }
        Err(error) if error.kind() == StoreErrorKind::ConnectionHeld => {
            tracing::error!(
                error = &error as &dyn std::error::Error,
                "the create's response over the cap holds the transaction's connection; \
                 nothing commits: read what the response needs before answering, or raise \
                 the response limit"
            );
            Outcome::CreateFailed
        }
        Err(error) if error.kind() == StoreErrorKind::CommitUnknown => {
            tracing::error!(
                error = &error as &dyn std::error::Error,
                "the create's transaction may have committed: its commit went unanswered"
            );
            Outcome::Unknown
        }
        Err(error) => {
            tracing::error!(
                error = &error as &dyn std::error::Error,
                "complete failed after the create"
            );
            if is_unknown(&error) {
                settle(
                    settling,
                    store.clone(),
                    key.to_owned(),
                    *reservation,
                    Settle::Complete(stored.clone()),
                );
            }
            Outcome::CompleteFailed
        }
    }
}
