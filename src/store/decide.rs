//! The claim's decision, written once: what a claim does with the record it found.
//!
//! Every built-in store reads the key's record and writes in one atomic step of its backend;
//! between the read and the write, it asks [`decide`]. The memory, SQLite, PostgreSQL and MySQL
//! stores call it; Redis runs the same steps inside its claim script (`claim.lua`, which names
//! this module), since the script must decide where the record is. A store of another backend
//! can call it too: it then answers as the built-in stores do by construction, and the
//! conformance suite checks the atomic step around it.

use super::{Claim, Lease, Reservation, StoreError, StoredResponse};

/// A key's record as a claim finds it, in the terms the decision needs.
///
/// `R` is the completed record's response in whatever form the store keeps it (its bytes,
/// say), decoded only if the claim replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found<R> {
    /// Claimed and not completed.
    Pending {
        /// The record's fingerprint is the claim's.
        same_fingerprint: bool,
        /// Pending under the claim's own reservation: the claim is a retry of one whose
        /// answer was lost.
        mine: bool,
        /// Its lease lapsed, and its claimer allowed a take-over ([`Lease::takes_over`]).
        abandoned: bool,
    },
    /// Completed with a response.
    Completed {
        /// The record's fingerprint is the claim's.
        same_fingerprint: bool,
        /// Past the store's retention: it counts as absent.
        expired: bool,
        /// The stored response.
        response: R,
    },
}

/// What a claim does, as [`decide`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<R> {
    /// Write a new pending record under the claim's reservation and lease: there was no
    /// record, or a completed one past its retention (written over). Then [`Claim::New`].
    Reserve,
    /// Write the claim's reservation and lease over the abandoned pending record, keeping its
    /// fingerprint. Then [`Claim::New`].
    TakeOver,
    /// The key is pending under the claim's reservation already: [`Claim::New`], no write.
    Mine,
    /// Another fingerprint holds the key: [`Claim::Conflict`].
    Conflict,
    /// Another attempt holds the key: [`Claim::Pending`].
    Pending,
    /// Completed: [`Claim::Replay`] with this response.
    Replay(R),
}

/// The claim's decision on the record it found (`None`: no record), for a claim under `lease`.
///
/// In this order: a completed record past its retention is absent; another fingerprint is a
/// conflict, whatever the record's state; then the claim's own reservation, a replay, a
/// take-over when both the record's claimer and this claim allow it, and otherwise pending.
///
/// ```
/// use tower_idempotency::store::{decide, Decision, Found, Lease};
///
/// let pending = Found::<()>::Pending { same_fingerprint: true, mine: false, abandoned: true };
/// assert_eq!(decide(Some(pending.clone()), Lease::default()), Decision::Pending);
/// assert_eq!(decide(Some(pending), Lease::default().take_over_abandoned()), Decision::TakeOver);
/// assert_eq!(decide::<()>(None, Lease::default()), Decision::Reserve);
/// ```
pub fn decide<R>(found: Option<Found<R>>, lease: Lease) -> Decision<R> {
    match found {
        None | Some(Found::Completed { expired: true, .. }) => Decision::Reserve,
        Some(
            Found::Pending {
                same_fingerprint: false,
                ..
            }
            | Found::Completed {
                same_fingerprint: false,
                ..
            },
        ) => Decision::Conflict,
        Some(Found::Pending { mine: true, .. }) => Decision::Mine,
        Some(Found::Completed { response, .. }) => Decision::Replay(response),
        Some(Found::Pending {
            abandoned: true, ..
        }) if lease.takes_over() => Decision::TakeOver,
        Some(Found::Pending { .. }) => Decision::Pending,
    }
}

impl<R> Decision<R> {
    /// The claim's answer when the decision writes nothing (`None` for [`Reserve`] and
    /// [`TakeOver`]): `reservation` for [`Mine`], the response read with `decode` for a
    /// replay.
    ///
    /// [`Reserve`]: Decision::Reserve
    /// [`TakeOver`]: Decision::TakeOver
    /// [`Mine`]: Decision::Mine
    ///
    /// ```
    /// use tower_idempotency::store::{Claim, Decision, Reservation, StoredResponse};
    ///
    /// let mine = Decision::<bytes::Bytes>::Mine.answer(Reservation::generate(), StoredResponse::from_bytes);
    /// assert!(matches!(mine, Some(Ok(Claim::New(_)))));
    /// ```
    pub fn answer(
        self,
        reservation: Reservation,
        decode: impl FnOnce(R) -> Result<StoredResponse, StoreError>,
    ) -> Option<Result<Claim, StoreError>> {
        match self {
            Self::Reserve | Self::TakeOver => None,
            Self::Mine => Some(Ok(Claim::New(reservation))),
            Self::Conflict => Some(Ok(Claim::Conflict)),
            Self::Pending => Some(Ok(Claim::Pending)),
            Self::Replay(response) => Some(decode(response).map(Claim::Replay)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(same_fingerprint: bool, mine: bool, abandoned: bool) -> Option<Found<u8>> {
        Some(Found::Pending {
            same_fingerprint,
            mine,
            abandoned,
        })
    }

    fn completed(same_fingerprint: bool, expired: bool) -> Option<Found<u8>> {
        Some(Found::Completed {
            same_fingerprint,
            expired,
            response: 7,
        })
    }

    #[test]
    fn every_record_decides_as_the_store_guide_says() {
        let plain = Lease::default();
        let taking = Lease::default().take_over_abandoned();
        for lease in [plain, taking] {
            assert_eq!(decide::<u8>(None, lease), Decision::Reserve);
            // Expired counts as absent, even under another fingerprint.
            assert_eq!(decide(completed(false, true), lease), Decision::Reserve);
            assert_eq!(decide(completed(true, true), lease), Decision::Reserve);
            // The fingerprint first, whatever the state.
            assert_eq!(decide(completed(false, false), lease), Decision::Conflict);
            for mine in [false, true] {
                for abandoned in [false, true] {
                    assert_eq!(
                        decide(pending(false, mine, abandoned), lease),
                        Decision::Conflict
                    );
                }
                assert_eq!(decide(pending(true, true, mine), lease), Decision::Mine);
            }
            assert_eq!(decide(completed(true, false), lease), Decision::Replay(7));
            assert_eq!(
                decide(pending(true, false, false), lease),
                Decision::Pending
            );
        }
        assert_eq!(
            decide(pending(true, false, true), plain),
            Decision::Pending,
            "a take-over only when the claim asks"
        );
        assert_eq!(
            decide(pending(true, false, true), taking),
            Decision::TakeOver
        );
    }

    #[test]
    fn only_decisions_without_a_write_answer() {
        let reservation = Reservation::generate();
        let decode = |_: u8| Err(StoreError::new(super::super::StoreErrorKind::Corrupt));
        assert!(Decision::Reserve.answer(reservation, decode).is_none());
        assert!(Decision::TakeOver.answer(reservation, decode).is_none());
        assert!(matches!(
            Decision::Mine.answer(reservation, decode),
            Some(Ok(Claim::New(r))) if r == reservation
        ));
        assert!(matches!(
            Decision::Conflict.answer(reservation, decode),
            Some(Ok(Claim::Conflict))
        ));
        assert!(matches!(
            Decision::Pending.answer(reservation, decode),
            Some(Ok(Claim::Pending))
        ));
        assert!(matches!(
            Decision::Replay(7).answer(reservation, decode),
            Some(Err(e)) if e.kind() == super::super::StoreErrorKind::Corrupt
        ));
    }
}
