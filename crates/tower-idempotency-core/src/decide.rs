//! The claim's decision, written once: what a claim does with the record it found.
//!
//! Every built-in store reads the key's record and writes in one atomic step of its backend;
//! between the read and the write, it asks [`decide`]. The memory, SQLite, PostgreSQL and MySQL
//! stores call it; Redis runs the same steps inside its claim script (`claim.lua`, which names
//! this module), since the script must decide where the record is. A store of another backend
//! can call it too: it then answers as the built-in stores do by construction, and the
//! conformance suite checks the atomic step around it.
//!
//! A store keeps, with a pending record, its reservation, its lease's deadline and whether
//! its claimer allowed a take-over ([`Lease::takes_over`] at the claim); with a completed one,
//! the response and when it was completed. Its claim, in one atomic step, here a lock:
//!
//! ```
//! use std::collections::HashMap;
//! use std::time::{Duration, Instant};
//! use tower_idempotency_core::Fingerprint;
//! use tower_idempotency_core::{
//!     Claim, Decision, Found, Lease, Reservation, StoreError, StoredResponse, Tombstone, decide,
//! };
//!
//! enum State {
//!     Pending { reservation: Reservation, until: Instant, take_over: bool },
//!     Completed(StoredResponse),
//! }
//! struct Record { fingerprint: Fingerprint, state: State }
//!
//! fn claim(
//!     records: &mut HashMap<String, Record>, // under the store's lock
//!     key: &str,
//!     fingerprint: &Fingerprint,
//!     reservation: Reservation,
//!     lease: Lease,
//! ) -> Result<Claim, StoreError> {
//!     let now = Instant::now();
//!     let found = records.get(key).map(|record| {
//!         let same_fingerprint = record.fingerprint == *fingerprint;
//!         match &record.state {
//!             State::Pending { reservation: held, until, take_over } => Found::Pending {
//!                 same_fingerprint,
//!                 mine: *held == reservation,
//!                 abandoned: *take_over && *until <= now,
//!             },
//!             // This one keeps records for good; a store with a retention says so here.
//!             State::Completed(response) => {
//!                 Found::Completed { same_fingerprint, expired: false, response: response.clone() }
//!             }
//!         }
//!     });
//!     match decide(found, lease) {
//!         // A new record, or the claim's own over an expired or abandoned one.
//!         Decision::Write(_) => {
//!             // A lease of any length: clamped rather than overflowing.
//!             let longest = Duration::from_secs(100 * 365 * 24 * 3600);
//!             let until = now.checked_add(lease.duration().min(longest)).unwrap_or(now);
//!             let state = State::Pending { reservation, until, take_over: lease.takes_over() };
//!             records.insert(key.to_owned(), Record { fingerprint: *fingerprint, state });
//!             Ok(Claim::New(reservation))
//!         }
//!         // It keeps `StoredResponse`s: nothing to decode. It keeps no tombstones (it never
//!         // finds `Found::Expired`); one that does reads its own here.
//!         Decision::Answer(answer) => answer.claim(reservation, Ok, |response| {
//!             Ok(Tombstone::of(&response, std::time::SystemTime::now()))
//!         }),
//!     }
//! }
//!
//! let mut records = HashMap::new();
//! let fingerprint = Fingerprint::digest(["POST", "/orders", "{}"]);
//! let first = claim(&mut records, "k", &fingerprint, Reservation::generate(), Lease::default());
//! assert!(matches!(first, Ok(Claim::New(_))));
//! let again = claim(&mut records, "k", &fingerprint, Reservation::generate(), Lease::default());
//! assert!(matches!(again, Ok(Claim::Pending)));
//! ```

use super::{Claim, Lease, Reservation, StoreError, StoredResponse, Tombstone};

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
        /// Its lease lapsed, and its claimer allowed a take-over ([`Lease::takes_over`]). A
        /// store may leave it `false` when the claim does not ask to take over, to spare a
        /// read of its clock: the decision is the same.
        abandoned: bool,
    },
    /// Completed with a response.
    Completed {
        /// The record's fingerprint is the claim's.
        same_fingerprint: bool,
        /// Past the store's retention, and past its tombstone window if it keeps tombstones:
        /// it counts as absent. (Past the retention and within the tombstone window, a store
        /// reports [`Found::Expired`] instead.)
        expired: bool,
        /// The stored response.
        response: R,
    },
    /// Completed, its replay window passed and its tombstone window not: the store remembers
    /// the operation (its [`Tombstone`](crate::Tombstone)), not its response.
    Expired {
        /// The record's fingerprint is the claim's.
        same_fingerprint: bool,
        /// What the store keeps to answer with: the tombstone, in whatever form the store
        /// keeps it (or the response it is made from, not yet dropped).
        tombstone: R,
    },
}

/// What a claim does, as [`decide`] says: write its reservation, or answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<R> {
    /// Write the claim's reservation and lease, then answer [`Claim::New`].
    Write(Write),
    /// Answer without writing.
    Answer(Answer<R>),
}

/// The write a claim makes before it answers [`Claim::New`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// A new pending record: there was no record, or a completed one past its retention
    /// (written over).
    Reserve,
    /// The claim's reservation and lease over the abandoned pending record, keeping its
    /// fingerprint.
    TakeOver,
}

/// A claim's answer when it writes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer<R> {
    /// The key is pending under the claim's reservation already: [`Claim::New`].
    Mine,
    /// Another fingerprint holds the key: [`Claim::Conflict`].
    Conflict,
    /// Another attempt holds the key: [`Claim::Pending`].
    Pending,
    /// Completed: [`Claim::Replay`] with this response.
    Replay(R),
    /// Completed and past its replay window: [`Claim::Expired`] with this tombstone.
    Expired(R),
}

/// The claim's decision on the record it found (`None`: no record), for a claim under `lease`.
///
/// In this order: a completed record past its retention (and its tombstone window) is absent,
/// as is a tombstone when the claim [forgets expired](Lease::forget_expired) operations;
/// another fingerprint is a conflict, whatever the record's state; then the claim's own
/// reservation, a replay, an expired operation, a take-over when both the record's claimer
/// and this claim allow it, and otherwise pending.
///
/// ```
/// use tower_idempotency_core::{Answer, Decision, Found, Lease, Write, decide};
///
/// let pending = Found::<()>::Pending { same_fingerprint: true, mine: false, abandoned: true };
/// assert_eq!(decide(Some(pending.clone()), Lease::default()), Decision::Answer(Answer::Pending));
/// let taking = Lease::default().take_over_abandoned();
/// assert_eq!(decide(Some(pending), taking), Decision::Write(Write::TakeOver));
/// assert_eq!(decide::<()>(None, Lease::default()), Decision::Write(Write::Reserve));
/// ```
pub fn decide<R>(found: Option<Found<R>>, lease: Lease) -> Decision<R> {
    let answer = match found {
        None | Some(Found::Completed { expired: true, .. }) => {
            return Decision::Write(Write::Reserve);
        }
        Some(Found::Expired { .. }) if lease.forgets_expired() => {
            return Decision::Write(Write::Reserve);
        }
        Some(
            Found::Pending {
                same_fingerprint: false,
                ..
            }
            | Found::Completed {
                same_fingerprint: false,
                ..
            }
            | Found::Expired {
                same_fingerprint: false,
                ..
            },
        ) => Answer::Conflict,
        Some(Found::Pending { mine: true, .. }) => Answer::Mine,
        Some(Found::Completed { response, .. }) => Answer::Replay(response),
        Some(Found::Expired { tombstone, .. }) => Answer::Expired(tombstone),
        Some(Found::Pending {
            abandoned: true, ..
        }) if lease.takes_over() => return Decision::Write(Write::TakeOver),
        Some(Found::Pending { .. }) => Answer::Pending,
    };
    Decision::Answer(answer)
}

impl<R> Answer<R> {
    /// The claim's answer: `reservation` for [`Mine`](Answer::Mine), the response read with
    /// `decode` for a replay ([`StoredResponse::from_bytes`] for a store that keeps bytes,
    /// `Ok` for one that keeps [`StoredResponse`]s), the tombstone read with `tombstone` for
    /// an expired operation ([`Tombstone::from_bytes`] for a store that keeps bytes).
    ///
    /// ```
    /// use tower_idempotency_core::{Answer, Claim, Reservation, StoredResponse, Tombstone};
    ///
    /// let bytes = |b: bytes::Bytes| Tombstone::from_bytes(&b);
    /// let mine = Answer::Mine.claim(Reservation::generate(), StoredResponse::from_bytes, bytes);
    /// assert!(matches!(mine, Ok(Claim::New(_))));
    /// ```
    pub fn claim(
        self,
        reservation: Reservation,
        decode: impl FnOnce(R) -> Result<StoredResponse, StoreError>,
        tombstone: impl FnOnce(R) -> Result<Tombstone, StoreError>,
    ) -> Result<Claim, StoreError> {
        match self {
            Self::Mine => Ok(Claim::New(reservation)),
            Self::Conflict => Ok(Claim::Conflict),
            Self::Pending => Ok(Claim::Pending),
            Self::Replay(response) => decode(response).map(Claim::Replay),
            Self::Expired(kept) => tombstone(kept).map(Claim::Expired),
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

    fn expired(same_fingerprint: bool) -> Option<Found<u8>> {
        Some(Found::Expired {
            same_fingerprint,
            tombstone: 9,
        })
    }

    const RESERVE: Decision<u8> = Decision::Write(Write::Reserve);

    fn answer(answer: Answer<u8>) -> Decision<u8> {
        Decision::Answer(answer)
    }

    #[test]
    fn every_record_decides_as_the_store_guide_says() {
        let plain = Lease::default();
        let taking = Lease::default().take_over_abandoned();
        for lease in [plain, taking] {
            assert_eq!(decide::<u8>(None, lease), RESERVE);
            // Expired counts as absent, even under another fingerprint.
            assert_eq!(decide(completed(false, true), lease), RESERVE);
            assert_eq!(decide(completed(true, true), lease), RESERVE);
            // The fingerprint first, whatever the state.
            assert_eq!(
                decide(completed(false, false), lease),
                answer(Answer::Conflict)
            );
            for mine in [false, true] {
                for abandoned in [false, true] {
                    assert_eq!(
                        decide(pending(false, mine, abandoned), lease),
                        answer(Answer::Conflict)
                    );
                }
            }
            for abandoned in [false, true] {
                assert_eq!(
                    decide(pending(true, true, abandoned), lease),
                    answer(Answer::Mine)
                );
            }
            assert_eq!(
                decide(completed(true, false), lease),
                answer(Answer::Replay(7))
            );
            assert_eq!(
                decide(pending(true, false, false), lease),
                answer(Answer::Pending)
            );
        }
        assert_eq!(
            decide(pending(true, false, true), plain),
            answer(Answer::Pending),
            "a take-over only when the claim asks"
        );
        assert_eq!(
            decide(pending(true, false, true), taking),
            Decision::Write(Write::TakeOver)
        );
    }

    #[test]
    fn a_tombstone_answers_expired_unless_the_claim_forgets_it() {
        for lease in [Lease::default(), Lease::default().take_over_abandoned()] {
            assert_eq!(decide(expired(true), lease), answer(Answer::Expired(9)));
            assert_eq!(decide(expired(false), lease), answer(Answer::Conflict));
            let forgetting = lease.forget_expired();
            assert_eq!(decide(expired(true), forgetting), RESERVE);
            assert_eq!(decide(expired(false), forgetting), RESERVE);
            // Forgetting tombstones changes nothing else.
            assert_eq!(
                decide(completed(true, false), forgetting),
                answer(Answer::Replay(7))
            );
            assert_eq!(
                decide(completed(false, false), forgetting),
                answer(Answer::Conflict)
            );
            assert_eq!(
                decide(pending(true, false, false), forgetting),
                answer(Answer::Pending)
            );
        }
    }

    #[test]
    fn each_answer_is_its_claim() {
        let reservation = Reservation::generate();
        let decode = |_: u8| Err(StoreError::new(super::super::StoreErrorKind::Corrupt));
        let stone = Tombstone::new(std::time::UNIX_EPOCH, http::StatusCode::CREATED, None);
        let tombstone = |kept: u8| {
            assert_eq!(kept, 9);
            Ok(stone.clone())
        };
        assert!(matches!(
            Answer::Mine.claim(reservation, decode, tombstone),
            Ok(Claim::New(r)) if r == reservation
        ));
        assert!(matches!(
            Answer::Conflict.claim(reservation, decode, tombstone),
            Ok(Claim::Conflict)
        ));
        assert!(matches!(
            Answer::Pending.claim(reservation, decode, tombstone),
            Ok(Claim::Pending)
        ));
        assert!(matches!(
            Answer::Replay(7).claim(reservation, decode, tombstone),
            Err(e) if e.kind() == super::super::StoreErrorKind::Corrupt
        ));
        assert_eq!(
            Answer::Expired(9)
                .claim(reservation, decode, tombstone)
                .unwrap(),
            Claim::Expired(stone.clone())
        );
    }
}
