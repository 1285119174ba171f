//! A store written the way a third party writes one: a crate of its own that depends on
//! `tower-idempotency-core` alone, held to the facade's public conformance suite
//! (`tests/conformance.rs`, with `tower-idempotency` as a dev-dependency). It keeps its
//! records in a mutexed map; a real one would keep them in its backend, one atomic step per
//! claim. The worked example of the core's guide to writing a store.

#![deny(missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tower_idempotency_core::{
    Claim, Decision, Fingerprint, Found, Lease, MAX_RETENTION, Operator, RecordInfo, Reservation,
    Store, StoreError, StoreErrorKind, StoredResponse, decide,
};

enum State {
    /// Claimed and creating, its lease lapsing at `until`; `take_over` if its owner allows a
    /// take-over once it lapsed.
    Pending {
        reservation: Reservation,
        until: Instant,
        take_over: bool,
    },
    /// Completed: what to replay, kept as the crate's record format, as a remote store would.
    Completed { response: bytes::Bytes },
}

struct Record {
    fingerprint: Fingerprint,
    state: State,
    /// When it was claimed or completed.
    since: Instant,
}

/// `now + lease`, clamped as the crate's stores clamp it: a lease of any length is accepted.
fn deadline(now: Instant, lease: Duration) -> Instant {
    now.checked_add(lease.min(MAX_RETENTION)).unwrap_or(now)
}

/// The toy store: clones share the map.
///
/// ```
/// use toy_idempotency_store::ToyStore;
/// use tower_idempotency_core::{Claim, Fingerprint, Store};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = ToyStore::new(None);
/// let fp = Fingerprint::digest(["k", "p"]);
/// assert!(matches!(store.claim("k", &fp).await, Ok(Claim::New(_))));
/// assert!(matches!(store.claim("k", &fp).await, Ok(Claim::Pending)));
/// # }
/// ```
#[derive(Clone, Default)]
pub struct ToyStore {
    records: Arc<Mutex<HashMap<String, Record>>>,
    retention: Option<Duration>,
}

impl ToyStore {
    /// An empty store whose completed records count as absent after `retention`, if any.
    pub fn new(retention: Option<Duration>) -> Self {
        Self {
            retention,
            ..Self::default()
        }
    }

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A completed record past its retention counts as absent.
    fn expired(&self, record: &Record) -> bool {
        matches!(record.state, State::Completed { .. })
            && self
                .retention
                .is_some_and(|retention| record.since.elapsed() >= retention)
    }

    fn lost() -> StoreError {
        StoreError::new(StoreErrorKind::ReservationLost)
    }

    /// Runs `f` on the record of `key` if it is pending under `reservation`.
    fn owned<T>(
        &self,
        key: &str,
        reservation: &Reservation,
        f: impl FnOnce(&mut HashMap<String, Record>) -> T,
    ) -> Result<T, StoreError> {
        let mut records = self.records();
        match records.get(key).map(|record| &record.state) {
            Some(State::Pending {
                reservation: owner, ..
            }) if owner == reservation => Ok(f(&mut records)),
            _ => Err(Self::lost()),
        }
    }
}

impl Store for ToyStore {
    /// The retention, for the layer to advertise (`Idempotency-TTL`).
    fn replay_window(&self) -> Option<Duration> {
        self.retention
    }

    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let fresh = Record {
            fingerprint: *fingerprint,
            state: State::Pending {
                reservation,
                until: deadline(now, lease.duration()),
                take_over: lease.takes_over(),
            },
            since: now,
        };
        let mut records = self.records();
        // The record in the decision's terms; then the one decision every built-in store
        // makes, and the write it calls for.
        let found = records.get(key).map(|record| {
            let same_fingerprint = record.fingerprint == *fingerprint;
            match &record.state {
                State::Completed { response } => Found::Completed {
                    same_fingerprint,
                    expired: self.expired(record),
                    response: response.clone(),
                },
                State::Pending {
                    reservation: owner,
                    until,
                    take_over,
                } => Found::Pending {
                    same_fingerprint,
                    mine: *owner == reservation,
                    abandoned: *take_over && *until <= now,
                },
            }
        });
        match decide(found, lease) {
            Decision::Write(_) => {
                records.insert(key.to_owned(), fresh);
                Ok(Claim::New(reservation))
            }
            Decision::Answer(answer) => answer.claim(
                reservation,
                StoredResponse::from_bytes,
                |kept: tower_idempotency_core::bytes::Bytes| {
                    tower_idempotency_core::Tombstone::from_bytes(&kept)
                },
            ),
        }
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.owned(key, reservation, |records| {
            if let Some(Record {
                state: State::Pending { until, .. },
                ..
            }) = records.get_mut(key)
            {
                *until = deadline(Instant::now(), lease);
            }
        })
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let response = response.to_bytes();
        self.owned(key, reservation, |records| {
            if let Some(record) = records.get_mut(key) {
                record.state = State::Completed { response };
                record.since = Instant::now();
            }
        })
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        self.owned(key, reservation, |records| {
            records.remove(key);
        })
    }
}

impl Operator for ToyStore {
    async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let records = self.records();
        let Some(record) = records.get(key).filter(|record| !self.expired(record)) else {
            return Ok(None);
        };
        let age = Some(record.since.elapsed());
        Ok(Some(match &record.state {
            State::Pending { until, .. } => {
                RecordInfo::pending(record.fingerprint, age, *until <= Instant::now())
            }
            State::Completed { response } => RecordInfo::completed(
                record.fingerprint,
                age,
                StoredResponse::from_bytes(response.clone())?.status(),
            ),
        }))
    }

    async fn pending_older_than(&self, age: Duration) -> Result<Vec<String>, StoreError> {
        let mut keys: Vec<String> = self
            .records()
            .iter()
            .filter(|(_, record)| {
                matches!(record.state, State::Pending { .. }) && record.since.elapsed() >= age
            })
            .map(|(key, _)| key.clone())
            .collect();
        keys.sort();
        Ok(keys)
    }

    async fn resolve(&self, key: &str, response: &StoredResponse) -> Result<(), StoreError> {
        let mut records = self.records();
        match records.get_mut(key) {
            Some(record) if matches!(record.state, State::Pending { .. }) => {
                record.state = State::Completed {
                    response: response.to_bytes(),
                };
                record.since = Instant::now();
                Ok(())
            }
            _ => Err(Self::lost()),
        }
    }

    async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let removed = self.records().remove(key);
        Ok(removed.is_some_and(|record| !self.expired(&record)))
    }
}
