//! The conformance suite every [`Store`] is held to, written once: the built-in stores run it,
//! and so can yours.
//!
//! Call [`store_conformance!`](crate::store_conformance) in a test file with an async
//! constructor of your store (`async fn(Option<Duration>) -> impl Operator`, the argument its
//! retention of completed records, if any) and the retention the retention test should use;
//! it expands to one `#[tokio::test]` per property (Tokio's `macros` and `rt-multi-thread`
//! features are needed in the test). Each function here is one property, callable on its own.
//! Keys are unique per call, so the suite runs against a shared server, in parallel.
//!
//! ```ignore
//! use std::time::Duration;
//!
//! async fn make_store(retention: Option<Duration>) -> MyStore {
//!     MyStore::connect("…").await.unwrap().retention(retention)
//! }
//!
//! tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));
//! ```
//!
//! `tests/toy_store.rs` in the repository is a complete worked example: a store written with the
//! public API alone that passes the suite.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::operation::Fingerprint;
use crate::store::Operator;
use crate::store::{Claim, Lease, Reservation, StoreErrorKind, StoredResponse};
use crate::{LabelContract, Store};

/// A key no other test (or earlier run) uses.
pub fn unique_key(name: &str) -> String {
    format!("{name}-{}", Reservation::generate())
}

fn fp(parcel: &str) -> Fingerprint {
    LabelContract::fingerprint("conformance", parcel)
}

/// A response with every awkward part a store must keep: two values of one header, a
/// non-UTF-8 value, and a body with bytes that are not text.
pub fn awkward_response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::LOCATION,
        HeaderValue::from_static("/labels/label-901"),
    );
    headers.append(header::ETAG, HeaderValue::from_static("\"label-901-v1\""));
    headers.append(header::ETAG, HeaderValue::from_static("\"backup\""));
    headers.insert(
        "x-raw",
        HeaderValue::from_bytes(b"caf\xe9 \xff\x80").unwrap(),
    );
    headers.insert("x-empty", HeaderValue::from_static(""));
    let body = Bytes::from_static(b"{\"label_id\":\"label-901\"}\n\0\xff\xfe end");
    StoredResponse::new(StatusCode::CREATED, headers, body)
}

async fn new(store: &impl Store, key: &str, fingerprint: &Fingerprint) -> Reservation {
    match store.claim(key, fingerprint).await.unwrap() {
        Claim::New(reservation) => reservation,
        other => panic!("expected new, got {other:?}"),
    }
}

/// A claim of `key` for the operation `parcel`, with the caller's token and lease.
async fn claim_with(
    store: &impl Store,
    key: &str,
    parcel: &str,
    token: Reservation,
    lease: Lease,
) -> Claim {
    store
        .claim_with(key, &fp(parcel), token, lease)
        .await
        .unwrap()
}

async fn claim(store: &impl Store, key: &str, fingerprint: &Fingerprint) -> Claim {
    store.claim(key, fingerprint).await.unwrap()
}

/// The four answers of a claim: new, then pending for the same operation, conflict for
/// another, and after the complete the stored response as a replay (conflict still for another).
pub async fn all_four_claim_outcomes(store: impl Store) {
    let key = unique_key("outcomes");
    let reservation = new(&store, &key, &fp("a")).await;
    assert_eq!(claim(&store, &key, &fp("a")).await, Claim::Pending);
    assert_eq!(claim(&store, &key, &fp("b")).await, Claim::Conflict);
    let response = awkward_response();
    store.complete(&key, &reservation, &response).await.unwrap();
    assert_eq!(claim(&store, &key, &fp("a")).await, Claim::Replay(response));
    assert_eq!(claim(&store, &key, &fp("b")).await, Claim::Conflict);
}

/// A claim answered at once ([`Store::claim_now`]) is the claim: the same answers as
/// [`Store::claim_with`], with the same effect, whichever of the two each claim goes through.
/// A store that answers no claim at once passes as it is; one that answers some at once and
/// leaves others to [`Store::claim_with`] is held to the answers it gives.
pub async fn a_claim_answered_at_once_is_the_claim(store: impl Store) {
    /// The claim at once, or through `claim_with` where the store does not answer at once.
    async fn either(store: &impl Store, key: &str, parcel: &str, token: Reservation) -> Claim {
        either_with(store, key, parcel, token, Lease::default()).await
    }
    async fn either_with(
        store: &impl Store,
        key: &str,
        parcel: &str,
        token: Reservation,
        lease: Lease,
    ) -> Claim {
        match store.claim_now(key, &fp(parcel), token, lease) {
            Some(answer) => answer.unwrap(),
            None => claim_with(store, key, parcel, token, lease).await,
        }
    }
    let key = unique_key("at-once");
    let token = Reservation::generate();
    assert_eq!(either(&store, &key, "a", token).await, Claim::New(token));
    // Its effect is the claim's, and the other way round.
    assert_eq!(claim(&store, &key, &fp("a")).await, Claim::Pending);
    let answers = [
        ("a", token, Claim::New(token)),
        ("a", Reservation::generate(), Claim::Pending),
        ("b", Reservation::generate(), Claim::Conflict),
    ];
    for (parcel, token, expected) in answers {
        assert_eq!(either(&store, &key, parcel, token).await, expected);
    }
    let response = awkward_response();
    store.complete(&key, &token, &response).await.unwrap();
    let replay = either(&store, &key, "a", Reservation::generate()).await;
    assert_eq!(replay, Claim::Replay(response));
    let conflict = either(&store, &key, "b", Reservation::generate()).await;
    assert_eq!(conflict, Claim::Conflict);
    let other = unique_key("at-once-after");
    let token = new(&store, &other, &fp("a")).await;
    assert_eq!(
        either(&store, &other, "a", token).await,
        Claim::New(token),
        "a claim made through claim_with is the same claim at once"
    );
    // An abandoned reservation is taken over at once only as `claim_with` takes it over.
    let abandoned = unique_key("at-once-abandoned");
    let short = Lease::new(Duration::from_millis(300)).take_over_abandoned();
    let owner = Reservation::generate();
    let claimed = either_with(&store, &abandoned, "a", owner, short).await;
    assert_eq!(claimed, Claim::New(owner));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let strict = either(&store, &abandoned, "a", Reservation::generate()).await;
    assert_eq!(strict, Claim::Pending, "at most once by default");
    let next = Reservation::generate();
    let taken = either_with(&store, &abandoned, "a", next, short).await;
    assert_eq!(taken, Claim::New(next));
}

/// Keys of any length a request can carry (a 3,000-character `request_id` fits the label
/// contract's body limit) work like short ones, and two long keys that differ only at the end
/// are two records.
pub async fn keys_of_any_length_work(store: impl Store) {
    // Hex of a pseudo-random sequence: a backend cannot compress it below an index's limit.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let noise: String = (0..375)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            format!("{:08x}", state >> 32)
        })
        .collect();
    let long = format!("{}{noise}", unique_key("long"));
    let other = format!("{long}2");
    let reservation = new(&store, &long, &fp("a")).await;
    assert_eq!(claim(&store, &long, &fp("a")).await, Claim::Pending);
    let stranger = new(&store, &other, &fp("b")).await;
    store.release(&other, &stranger).await.unwrap();
    store
        .complete(&long, &reservation, &awkward_response())
        .await
        .unwrap();
    assert_eq!(
        claim(&store, &long, &fp("a")).await,
        Claim::Replay(awkward_response())
    );
    assert_eq!(claim(&store, &long, &fp("b")).await, Claim::Conflict);
    new(&store, &other, &fp("b")).await;
}

/// A claim with the caller's token is idempotent: the same token gets `New` again while the
/// key is pending under it, and it can release what a lost claim reserved; another token gets
/// `Pending`, another fingerprint `Conflict`.
pub async fn a_claim_with_the_same_token_is_new_again(store: impl Store) {
    let key = unique_key("token");
    let token = Reservation::generate();
    for _ in 0..2 {
        assert_eq!(
            claim_with(&store, &key, "a", token, Lease::default()).await,
            Claim::New(token)
        );
    }
    let other = Reservation::generate();
    assert_eq!(
        claim_with(&store, &key, "a", other, Lease::default()).await,
        Claim::Pending
    );
    assert_eq!(
        claim_with(&store, &key, "b", token, Lease::default()).await,
        Claim::Conflict
    );
    store.release(&key, &token).await.unwrap();
    assert_eq!(
        claim_with(&store, &key, "a", other, Lease::default()).await,
        Claim::New(other)
    );
    store
        .complete(&key, &other, &awkward_response())
        .await
        .unwrap();
    assert_eq!(
        claim_with(&store, &key, "a", other, Lease::default()).await,
        Claim::Replay(awkward_response()),
        "a completed record replays, whoever asks"
    );
}

/// Tokens are compared whole: two that share their low or their high 64 bits are two
/// reservations.
pub async fn tokens_are_compared_in_every_bit(store: impl Store) {
    for (held, other) in [
        (1u128 << 64 | 7, 2u128 << 64 | 7),
        (5u128 << 64 | 1, 5u128 << 64 | 2),
    ] {
        let key = unique_key("token-bits");
        let (held, other) = (Reservation::from_u128(held), Reservation::from_u128(other));
        new_with(&store, &key, held).await;
        let claimed = claim_with(&store, &key, "a", other, Lease::default()).await;
        assert_eq!(claimed, Claim::Pending);
        let released = store.release(&key, &other).await.map_err(|e| e.kind());
        assert_eq!(released, Err(StoreErrorKind::ReservationLost));
        store.release(&key, &held).await.unwrap();
    }
}

/// Settling a lost claim leaves the key free if the claim took effect, free if it did not,
/// and someone else's record as it was.
pub async fn settling_a_lost_claim_frees_only_its_own_reservation(store: impl Store) {
    let key = unique_key("settle");
    let token = Reservation::generate();
    new_with(&store, &key, token).await;
    store.settle_claim(&key, &fp("a"), token).await.unwrap();
    let free = Reservation::generate();
    new_with(&store, &key, free).await;
    store.settle_claim(&key, &fp("a"), token).await.unwrap();
    assert_eq!(
        claim(&store, &key, &fp("a")).await,
        Claim::Pending,
        "another reservation is left alone"
    );
    store.release(&key, &free).await.unwrap();
    let never = unique_key("settle-never");
    store.settle_claim(&never, &fp("a"), token).await.unwrap();
    new(&store, &never, &fp("a")).await;
}

async fn new_with(store: &impl Store, key: &str, token: Reservation) {
    assert_eq!(
        claim_with(store, key, "a", token, Lease::default()).await,
        Claim::New(token)
    );
}

/// An operator sees a stuck key pending with its age and fingerprint, lists it among the
/// pending keys old enough, resolves it into a replay, and forgets a key to free it.
pub async fn an_operator_sees_resolves_and_forgets_stuck_keys(store: impl Operator) {
    use crate::store::RecordState;
    let stuck = unique_key("stuck");
    let done = unique_key("done");
    new(&store, &stuck, &fp("a")).await;
    let reservation = new(&store, &done, &fp("b")).await;
    store
        .complete(&done, &reservation, &awkward_response())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;

    let info = store.inspect(&stuck).await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::Pending);
    assert_eq!(info.fingerprint, fp("a"));
    assert_eq!(info.status, None);
    let age = info.age.expect("a pending record's age");
    assert!(
        age >= Duration::from_millis(20) && age < Duration::from_secs(60),
        "{age:?}"
    );
    let info = store.inspect(&done).await.unwrap().unwrap();
    assert_eq!(
        (info.state, info.status),
        (RecordState::Completed, Some(StatusCode::CREATED))
    );
    assert_eq!(store.inspect(&unique_key("none")).await.unwrap(), None);

    let pending = store.pending_older_than(Duration::ZERO).await.unwrap();
    assert!(pending.contains(&stuck), "{pending:?}");
    assert!(!pending.contains(&done));
    let young = store
        .pending_older_than(Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(!young.contains(&stuck));

    let resolved = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), "resolved".into());
    store.resolve(&stuck, &resolved).await.unwrap();
    assert_eq!(
        claim(&store, &stuck, &fp("a")).await,
        Claim::Replay(resolved.clone())
    );
    assert_eq!(
        store.resolve(&stuck, &resolved).await.unwrap_err().kind(),
        StoreErrorKind::ReservationLost,
        "only a pending key is resolved"
    );
    assert!(store.forget(&stuck).await.unwrap());
    assert!(!store.forget(&stuck).await.unwrap());
    new(&store, &stuck, &fp("c")).await;
}

/// A reservation's lease lapses unless renewed; then the key is abandoned, and only a claim
/// that takes over abandoned keys reserves it anew (same fingerprint only), and only if its
/// owner let it. The owner whose lease lapsed is fenced out of every write; a completed record
/// is never taken over.
pub async fn an_abandoned_key_is_taken_over_only_when_asked(store: impl Operator) {
    let key = unique_key("abandoned");
    let at_most_once = unique_key("abandoned-at-most-once");
    let lease = Lease::new(Duration::from_millis(800)).take_over_abandoned();
    let take_over = Lease::default().take_over_abandoned();
    let owner = Reservation::generate();
    let claim_key = |token, parcel, lease| claim_with(&store, &key, parcel, token, lease);
    let strict = Reservation::generate();
    let strict_lease = Lease::new(Duration::from_millis(800));
    let claimed = claim_with(&store, &at_most_once, "a", strict, strict_lease).await;
    assert_eq!(claimed, Claim::New(strict));
    assert_eq!(claim_key(owner, "a", lease).await, Claim::New(owner));
    assert!(!store.inspect(&key).await.unwrap().unwrap().abandoned);
    let early = Reservation::generate();
    assert_eq!(
        claim_key(early, "a", take_over).await,
        Claim::Pending,
        "a live lease is not taken over"
    );

    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(store.inspect(&key).await.unwrap().unwrap().abandoned);
    let next = Reservation::generate();
    assert_eq!(
        claim_key(next, "a", Lease::default()).await,
        Claim::Pending,
        "at most once by default"
    );
    assert_eq!(claim_key(next, "b", take_over).await, Claim::Conflict);
    assert!(
        store
            .inspect(&at_most_once)
            .await
            .unwrap()
            .unwrap()
            .abandoned
    );
    assert_eq!(
        claim_with(&store, &at_most_once, "a", next, take_over).await,
        Claim::Pending,
        "its owner claimed it at most once: never taken over"
    );
    assert_eq!(claim_key(next, "a", take_over).await, Claim::New(next));
    assert!(!store.inspect(&key).await.unwrap().unwrap().abandoned);

    let lost = |error: crate::store::StoreError| error.kind();
    let response = awkward_response();
    assert_eq!(
        store
            .renew(&key, &owner, Lease::DEFAULT)
            .await
            .map_err(lost),
        Err(StoreErrorKind::ReservationLost)
    );
    assert_eq!(
        store.complete(&key, &owner, &response).await.map_err(lost),
        Err(StoreErrorKind::ReservationLost)
    );
    assert_eq!(
        store.release(&key, &owner).await.map_err(lost),
        Err(StoreErrorKind::ReservationLost)
    );
    store.complete(&key, &next, &response).await.unwrap();
    let late = Reservation::generate();
    assert_eq!(
        claim_key(late, "a", take_over).await,
        Claim::Replay(response)
    );
}

/// Renewing keeps a reservation in progress past its first lease; only its owner renews a
/// pending key; once renewals stop, the lease lapses.
pub async fn renewing_keeps_a_lease_alive(store: impl Operator) {
    let key = unique_key("renew");
    let lease = Duration::from_millis(900);
    let owner = Reservation::generate();
    let owner_lease = Lease::new(lease).take_over_abandoned();
    assert_eq!(
        claim_with(&store, &key, "a", owner, owner_lease).await,
        Claim::New(owner)
    );
    let take_over = Lease::default().take_over_abandoned();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        store.renew(&key, &owner, lease).await.unwrap();
    }
    assert!(!store.inspect(&key).await.unwrap().unwrap().abandoned);
    let other = Reservation::generate();
    assert_eq!(
        claim_with(&store, &key, "a", other, take_over).await,
        Claim::Pending,
        "renewed past its first lease: still in progress"
    );
    let kind = |result: Result<(), crate::store::StoreError>| result.map_err(|e| e.kind());
    assert_eq!(
        kind(store.renew(&key, &other, lease).await),
        Err(StoreErrorKind::ReservationLost)
    );
    assert_eq!(
        kind(store.renew(&unique_key("renew-none"), &owner, lease).await),
        Err(StoreErrorKind::ReservationLost)
    );

    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(store.inspect(&key).await.unwrap().unwrap().abandoned);
    assert_eq!(
        claim_with(&store, &key, "a", other, take_over).await,
        Claim::New(other)
    );
    store
        .complete(&key, &other, &awkward_response())
        .await
        .unwrap();
    assert_eq!(
        kind(store.renew(&key, &other, lease).await),
        Err(StoreErrorKind::ReservationLost),
        "a completed record has no lease"
    );
    let info = store.inspect(&key).await.unwrap().unwrap();
    assert!(!info.abandoned, "a completed record is never abandoned");
}

/// Any retention is accepted, the longest included: completing and replaying work.
pub async fn any_retention_is_accepted(store: impl Store) {
    let key = unique_key("forever");
    let reservation = new(&store, &key, &fp("a")).await;
    store
        .complete(&key, &reservation, &awkward_response())
        .await
        .unwrap();
    assert_eq!(
        claim(&store, &key, &fp("a")).await,
        Claim::Replay(awkward_response())
    );
}

/// Another operation with the key is a conflict whether the record is pending or completed,
/// and the conflicting claim changes nothing.
pub async fn conflict_is_decided_before_the_status_and_changes_nothing(store: impl Store) {
    let key = unique_key("conflict");
    let reservation = new(&store, &key, &fp("a")).await;
    assert_eq!(claim(&store, &key, &fp("b")).await, Claim::Conflict);
    assert_eq!(
        claim(&store, &key, &fp("a")).await,
        Claim::Pending,
        "still pending for a"
    );
    store
        .complete(&key, &reservation, &awkward_response())
        .await
        .unwrap();
    assert_eq!(claim(&store, &key, &fp("b")).await, Claim::Conflict);
    assert_eq!(
        claim(&store, &key, &fp("a")).await,
        Claim::Replay(awkward_response()),
        "still completed for a"
    );
}

/// A replay is the completed response exactly: status, every header value in order (bytes
/// that are not UTF-8, empty values) and the body, empty bodies included.
pub async fn replay_is_byte_exact(store: impl Store) {
    let key = unique_key("replay");
    let reservation = new(&store, &key, &fp("a")).await;
    let response = awkward_response();
    store.complete(&key, &reservation, &response).await.unwrap();
    let Claim::Replay(replayed) = claim(&store, &key, &fp("a")).await else {
        panic!("expected replay")
    };
    assert_eq!(replayed.status(), response.status());
    assert_eq!(replayed.body(), response.body());
    let values = |r: &StoredResponse, name: &str| -> Vec<Vec<u8>> {
        r.headers()
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect()
    };
    for name in ["content-type", "location", "etag", "x-raw", "x-empty"] {
        assert_eq!(values(&replayed, name), values(&response, name), "{name}");
    }
    assert_eq!(
        values(&replayed, "etag"),
        [b"\"label-901-v1\"".to_vec(), b"\"backup\"".to_vec()]
    );
    assert_eq!(replayed.headers().len(), response.headers().len());

    // An empty body and no headers are kept as they are too.
    let key = unique_key("replay-empty");
    let reservation = new(&store, &key, &fp("a")).await;
    let empty = StoredResponse::new(StatusCode::NO_CONTENT, HeaderMap::new(), Bytes::new());
    store.complete(&key, &reservation, &empty).await.unwrap();
    assert_eq!(claim(&store, &key, &fp("a")).await, Claim::Replay(empty));
}

/// A response with trailers (a gRPC response's `grpc-status` and `grpc-message`, custom
/// ones, a name given twice, bytes that are not UTF-8) replays with them exactly; the same
/// response without trailers replays without.
pub async fn trailers_are_stored_and_replayed(store: impl Store) {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("9"));
    trailers.insert(
        "grpc-message",
        HeaderValue::from_static("idempotency_conflict"),
    );
    trailers.append("x-trailer", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    trailers.append("x-trailer", HeaderValue::from_static(""));
    let with = awkward_response().with_trailers(trailers.clone());
    let key = unique_key("trailers");
    let reservation = new(&store, &key, &fp("a")).await;
    store.complete(&key, &reservation, &with).await.unwrap();
    let Claim::Replay(replayed) = claim(&store, &key, &fp("a")).await else {
        panic!("expected replay")
    };
    assert_eq!(replayed.trailers(), Some(&trailers));
    let values: Vec<_> = replayed
        .trailers()
        .unwrap()
        .get_all("x-trailer")
        .iter()
        .collect();
    assert_eq!(values, [&b"caf\xe9"[..], b""]);
    assert_eq!(replayed, with);

    // Empty trailers are trailers still; none are none.
    let key = unique_key("trailers-empty");
    let reservation = new(&store, &key, &fp("a")).await;
    let empty = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new())
        .with_trailers(HeaderMap::new());
    store.complete(&key, &reservation, &empty).await.unwrap();
    assert_eq!(claim(&store, &key, &fp("a")).await, Claim::Replay(empty));
    let key = unique_key("trailers-none");
    let reservation = new(&store, &key, &fp("a")).await;
    store
        .complete(&key, &reservation, &awkward_response())
        .await
        .unwrap();
    let Claim::Replay(replayed) = claim(&store, &key, &fp("a")).await else {
        panic!("expected replay")
    };
    assert_eq!(replayed.trailers(), None);
}

/// Complete acts only under the claim's reservation: a stranger's is refused with
/// `ReservationLost`, and a completed record cannot be completed again.
pub async fn complete_is_guarded_by_the_reservation(store: impl Store) {
    let key = unique_key("complete");
    let reservation = new(&store, &key, &fp("a")).await;
    let stranger = Reservation::generate();
    let error = store
        .complete(&key, &stranger, &awkward_response())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::ReservationLost);
    assert_eq!(claim(&store, &key, &fp("a")).await, Claim::Pending);

    let first = awkward_response();
    store.complete(&key, &reservation, &first).await.unwrap();
    let second = StoredResponse::new(StatusCode::OK, HeaderMap::new(), "second".into());
    let error = store
        .complete(&key, &reservation, &second)
        .await
        .unwrap_err();
    assert_eq!(
        error.kind(),
        StoreErrorKind::ReservationLost,
        "a completed record is final"
    );
    assert_eq!(claim(&store, &key, &fp("a")).await, Claim::Replay(first));

    let never_claimed = unique_key("complete-unclaimed");
    let error = store
        .complete(&never_claimed, &reservation, &second)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::ReservationLost);
    assert!(matches!(
        claim(&store, &never_claimed, &fp("a")).await,
        Claim::New(_)
    ));
}

/// Release acts only under the claim's reservation: a stranger's is refused with
/// `ReservationLost` and leaves the key pending; the owner's frees the key.
pub async fn release_is_guarded_by_the_reservation(store: impl Store) {
    let key = unique_key("release");
    let reservation = new(&store, &key, &fp("a")).await;
    let error = store
        .release(&key, &Reservation::generate())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::ReservationLost);
    assert_eq!(
        claim(&store, &key, &fp("a")).await,
        Claim::Pending,
        "someone else's is kept"
    );

    store.release(&key, &reservation).await.unwrap();
    let again = new(&store, &key, &fp("b")).await; // new again, for any operation

    // A stale attempt can neither complete nor release the new reservation.
    let stale = store
        .complete(&key, &reservation, &awkward_response())
        .await
        .unwrap_err();
    assert_eq!(stale.kind(), StoreErrorKind::ReservationLost);
    let stale = store.release(&key, &reservation).await.unwrap_err();
    assert_eq!(stale.kind(), StoreErrorKind::ReservationLost);
    assert_eq!(claim(&store, &key, &fp("b")).await, Claim::Pending);

    // Release never deletes a completed record.
    store
        .complete(&key, &again, &awkward_response())
        .await
        .unwrap();
    let error = store.release(&key, &again).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::ReservationLost);
    assert_eq!(
        claim(&store, &key, &fp("b")).await,
        Claim::Replay(awkward_response())
    );
}

/// `store` drops completed records after `retention`; pending ones stay.
pub async fn retention_drops_completed_records_only(store: impl Store, retention: Duration) {
    let completed = unique_key("retention-completed");
    let pending = unique_key("retention-pending");
    let reservation = new(&store, &completed, &fp("a")).await;
    new(&store, &pending, &fp("a")).await;
    store
        .complete(&completed, &reservation, &awkward_response())
        .await
        .unwrap();
    assert!(matches!(
        claim(&store, &completed, &fp("a")).await,
        Claim::Replay(_)
    ));
    tokio::time::sleep(retention + retention / 2 + Duration::from_millis(50)).await;
    assert!(
        matches!(claim(&store, &completed, &fp("b")).await, Claim::New(_)),
        "an expired completed record is gone"
    );
    assert_eq!(
        claim(&store, &pending, &fp("a")).await,
        Claim::Pending,
        "pending never expires"
    );
}

/// Concurrent claims of one key, released together: exactly one is new, every other pending;
/// over eight keys, so that an atomicity gap has many chances to show. Also for claims that
/// race to take over one abandoned key: exactly one takes it.
pub async fn concurrent_claims_of_one_key_give_exactly_one_new(store: impl Store) {
    const CLAIMS: usize = 32;
    /// `CLAIMS` claims of `key` released at once by a barrier: how many were new.
    async fn race<St: Store>(store: &St, key: &str, lease: Lease) -> usize {
        let barrier = Arc::new(tokio::sync::Barrier::new(CLAIMS));
        let key: Arc<str> = Arc::from(key);
        let tasks: Vec<_> = (0..CLAIMS)
            .map(|_| {
                let (store, key, barrier) = (store.clone(), Arc::clone(&key), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .claim_with(&key, &fp("a"), Reservation::generate(), lease)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut new = 0;
        for task in tasks {
            match task.await.unwrap() {
                Claim::New(_) => new += 1,
                Claim::Pending => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        new
    }
    for _ in 0..8 {
        assert_eq!(race(&store, &unique_key("race"), Lease::default()).await, 1);
    }
    let key = unique_key("race-take-over");
    let owner = Reservation::generate();
    let short = Lease::new(Lease::MIN).take_over_abandoned();
    assert_eq!(
        claim_with(&store, &key, "a", owner, short).await,
        Claim::New(owner)
    );
    tokio::time::sleep(Lease::MIN * 4).await;
    let take_over = Lease::default().take_over_abandoned();
    assert_eq!(race(&store, &key, take_over).await, 1, "one takes it over");
}

/// Keys are compared exactly, as bytes: keys that differ only in case, in a trailing space, in
/// the Unicode normalization of a letter, or in a separator are different records.
pub async fn keys_are_compared_exactly(store: impl Store) {
    let base = unique_key("exact");
    let keys = [
        format!("POST /payments {base}-abc"),
        format!("POST /payments {base}-ABC"),
        format!("POST /payments {base}-abc "),
        format!("POST /payments {base}-caf\u{e9}"),
        format!("POST /payments {base}-cafe\u{301}"),
        format!("POST /payments {base}:abc"),
        format!("POST /payments/{base}-abc"),
    ];
    for key in &keys {
        new(&store, key, &fp("a")).await;
    }
    for key in &keys {
        assert_eq!(
            claim(&store, key, &fp("a")).await,
            Claim::Pending,
            "{key:?}"
        );
    }
}

/// The owner of a reservation whose lease lapsed, and that nobody took over, still renews and
/// completes it: a lapse only lets another claim take the key over when both allow it. A
/// lease of any length is accepted (the longest ones are clamped, never an overflow).
pub async fn the_owner_writes_after_its_lease_lapsed(store: impl Store) {
    let key = unique_key("lapsed");
    let owner = Reservation::generate();
    let lease = Lease::new(Lease::MIN).take_over_abandoned();
    assert_eq!(
        claim_with(&store, &key, "a", owner, lease).await,
        Claim::New(owner)
    );
    tokio::time::sleep(Lease::MIN * 4).await;
    store.renew(&key, &owner, Lease::MIN).await.unwrap();
    tokio::time::sleep(Lease::MIN * 4).await;
    let response = awkward_response();
    store.complete(&key, &owner, &response).await.unwrap();
    assert_eq!(claim(&store, &key, &fp("a")).await, Claim::Replay(response));

    let endless = unique_key("endless");
    let owner = Reservation::generate();
    let lease = Lease::new(Duration::MAX).take_over_abandoned();
    assert_eq!(
        claim_with(&store, &endless, "a", owner, lease).await,
        Claim::New(owner)
    );
    store.renew(&endless, &owner, Duration::MAX).await.unwrap();
    assert_eq!(
        claim_with(&store, &endless, "a", Reservation::generate(), lease).await,
        Claim::Pending,
        "an endless lease never lapses"
    );
    store.release(&endless, &owner).await.unwrap();
}

/// An operator frees a pending key (`forget`, then a new claim is new) and resolves only a
/// pending one: resolving an absent key changes nothing.
pub async fn an_operator_forgets_pending_keys_and_resolves_only_pending_ones(store: impl Operator) {
    let stuck = unique_key("forget-pending");
    new(&store, &stuck, &fp("a")).await;
    assert!(store.forget(&stuck).await.unwrap());
    new(&store, &stuck, &fp("b")).await;
    let absent = unique_key("resolve-absent");
    assert_eq!(
        store
            .resolve(&absent, &awkward_response())
            .await
            .unwrap_err()
            .kind(),
        StoreErrorKind::ReservationLost
    );
    assert_eq!(store.inspect(&absent).await.unwrap(), None);
}

/// `changed` waits while nothing changes (it does not end at once), and a change wakes every
/// request waiting on the key: for a resolve and a forget as for a complete and a release.
pub async fn changed_waits_and_wakes_every_waiter(store: impl Operator) {
    for resolve in [true, false] {
        let key = unique_key("waiters");
        new(&store, &key, &fp("a")).await;
        let first = store.changed(&key);
        let second = store.changed(&key);
        let mut first = std::pin::pin!(first);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), first.as_mut())
                .await
                .is_err(),
            "changed ended with nothing changed"
        );
        if resolve {
            store.resolve(&key, &awkward_response()).await.unwrap();
        } else {
            assert!(store.forget(&key).await.unwrap());
        }
        let both = async {
            first.await;
            second.await;
        };
        tokio::time::timeout(Duration::from_millis(500), both)
            .await
            .expect("both waiters woken");
    }
}

/// `changed` sees a change made after it was called, even before its first poll: it ends well
/// before any fallback poll of a store that listens (a second), for a complete and a release.
pub async fn changed_sees_a_change_made_before_its_first_poll<St: Store>(store: St) {
    for complete in [true, false] {
        let key = unique_key("changed");
        let Ok(Claim::New(reservation)) = store.claim(&key, &fp("p")).await else {
            panic!("a new claim");
        };
        let changed = store.changed(&key);
        if complete {
            store
                .complete(&key, &reservation, &awkward_response())
                .await
                .unwrap();
        } else {
            store.release(&key, &reservation).await.unwrap();
        }
        tokio::time::timeout(Duration::from_millis(500), changed)
            .await
            .expect("the change is seen");
    }
}

/// A `POST /labels` of the lesson's contract with key and `request_id` `key`.
fn label_request(key: &str) -> http::Request<http_body_util::Full<Bytes>> {
    let body = format!(r#"{{"request_id":"{key}","parcel_id":"parcel-42"}}"#);
    let mut request = http::Request::new(http_body_util::Full::new(Bytes::from(body)));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static("/labels");
    let headers = request.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(value) = HeaderValue::try_from(key) {
        headers.insert(crate::operation::IDEMPOTENCY_KEY, value);
    }
    request
}

/// Sends the label request of `key` through `service`, checks that it is answered
/// `409 request_pending`, and returns how long that took.
async fn pending<S, B>(service: &S, key: &str) -> Duration
where
    S: tower::Service<http::Request<http_body_util::Full<Bytes>>, Response = http::Response<B>>
        + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let started = std::time::Instant::now();
    let response = service
        .clone()
        .oneshot(label_request(key))
        .await
        .expect("an answer");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body, r#"{"error":"request_pending"}"#);
    started.elapsed()
}

/// `pending_wait` through the layer on the store: a wait that runs out answers
/// `409 request_pending` after about the wait, and without the setting the `409` is immediate,
/// as the contract says. One create.
pub async fn a_wait_runs_out_and_without_it_the_409_is_immediate<St: Store>(store: St) {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower::{Layer, ServiceExt};

    use crate::IdempotencyLayer;

    let creates = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&creates);
    // A create that takes 900 ms.
    let create = tower::service_fn(move |_: http::Request<_>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(900)).await;
            let mut response =
                http::Response::new(http_body_util::Full::new(Bytes::from_static(b"{}")));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let waiting = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .pending_wait(Duration::from_millis(200))
        .layer(create.clone());
    let at_once = IdempotencyLayer::new(store, LabelContract)
        .global_keys()
        .layer(create);
    let key = unique_key("runs-out");
    let first = tokio::spawn(waiting.clone().oneshot(label_request(&key)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waited = pending(&waiting, &key).await;
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_millis(600),
        "the wait ran out after {waited:?}"
    );
    let answered = pending(&at_once, &key).await;
    assert!(
        answered < Duration::from_millis(150),
        "without the setting the 409 took {answered:?}"
    );
    let first = first.await.expect("the first attempt").expect("an answer");
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// Instantiates the [conformance suite](crate::testing::conformance) for a store made by
/// `$make(retention)`: one `#[tokio::test]` per property, in a module `conformance`.
///
/// `$make` is an `async fn(Option<Duration>) -> St` where `St:`
/// [`Operator`](crate::store::Operator), the argument the retention of completed records to
/// give the store (`None`: keep them); `retention = …` is the retention the retention test
/// uses (long enough for a round trip to the store, short enough to wait for).
///
/// ```ignore
/// tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300));
/// ```
///
/// A store without [`Operator`](crate::store::Operator) runs every property but the
/// operator's (inspecting, resolving and forgetting keys, the lease as an operator sees it):
///
/// ```ignore
/// tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(300), without_operator);
/// ```
#[macro_export]
macro_rules! store_conformance {
    ($make:path, retention = $retention:expr) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            use $crate::testing::conformance as suite;

            $crate::store_conformance!(@store $make, $retention);
            $crate::store_conformance!(@operator $make);
        }
    };
    ($make:path, retention = $retention:expr, without_operator) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            use $crate::testing::conformance as suite;

            $crate::store_conformance!(@store $make, $retention);
        }
    };
    (@store $make:path, $retention:expr) => {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn all_four_claim_outcomes() {
                suite::all_four_claim_outcomes($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn conflict_is_decided_before_the_status_and_changes_nothing() {
                suite::conflict_is_decided_before_the_status_and_changes_nothing($make(::core::option::Option::None).await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_claim_answered_at_once_is_the_claim() {
                suite::a_claim_answered_at_once_is_the_claim($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_claim_with_the_same_token_is_new_again() {
                suite::a_claim_with_the_same_token_is_new_again($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tokens_are_compared_in_every_bit() {
                suite::tokens_are_compared_in_every_bit($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn settling_a_lost_claim_frees_only_its_own_reservation() {
                suite::settling_a_lost_claim_frees_only_its_own_reservation($make(::core::option::Option::None).await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn keys_of_any_length_work() {
                suite::keys_of_any_length_work($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn any_retention_is_accepted() {
                suite::any_retention_is_accepted($make(::core::option::Option::Some(std::time::Duration::MAX)).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn replay_is_byte_exact() {
                suite::replay_is_byte_exact($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn trailers_are_stored_and_replayed() {
                suite::trailers_are_stored_and_replayed($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn complete_is_guarded_by_the_reservation() {
                suite::complete_is_guarded_by_the_reservation($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn release_is_guarded_by_the_reservation() {
                suite::release_is_guarded_by_the_reservation($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retention_drops_completed_records_only() {
                let retention: std::time::Duration = $retention;
                suite::retention_drops_completed_records_only(
                    $make(::core::option::Option::Some(retention)).await,
                    retention,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn changed_sees_a_change_made_before_its_first_poll() {
                suite::changed_sees_a_change_made_before_its_first_poll($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_wait_runs_out_and_without_it_the_409_is_immediate() {
                suite::a_wait_runs_out_and_without_it_the_409_is_immediate($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_claims_of_one_key_give_exactly_one_new() {
                suite::concurrent_claims_of_one_key_give_exactly_one_new($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn keys_are_compared_exactly() {
                suite::keys_are_compared_exactly($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_owner_writes_after_its_lease_lapsed() {
                suite::the_owner_writes_after_its_lease_lapsed($make(::core::option::Option::None).await).await;
            }
    };
    (@operator $make:path) => {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_operator_sees_resolves_and_forgets_stuck_keys() {
                suite::an_operator_sees_resolves_and_forgets_stuck_keys($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_abandoned_key_is_taken_over_only_when_asked() {
                suite::an_abandoned_key_is_taken_over_only_when_asked($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn renewing_keeps_a_lease_alive() {
                suite::renewing_keeps_a_lease_alive($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_operator_forgets_pending_keys_and_resolves_only_pending_ones() {
                suite::an_operator_forgets_pending_keys_and_resolves_only_pending_ones($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn changed_waits_and_wakes_every_waiter() {
                suite::changed_waits_and_wakes_every_waiter($make(::core::option::Option::None).await).await;
            }
    };
}
