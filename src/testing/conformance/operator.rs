//! The operator's view, leases and abandoned keys.

use std::time::Duration;

use http::{HeaderMap, StatusCode};

use super::{awkward_response, claim, claim_with, create, fp, lapsed, new, unique_key};
use crate::store::Store;
use crate::store::{Claim, Lease, Operator, Reservation, StoreErrorKind, StoredResponse};

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
    // Zero lists every pending key, one claimed this very millisecond too.
    let fresh = unique_key("fresh");
    new(&store, &fresh, &fp("a")).await;
    let pending = store.pending_older_than(Duration::ZERO).await.unwrap();
    assert!(pending.contains(&fresh), "{pending:?}");
    store.forget(&fresh).await.unwrap();

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
            .renew(&key, &owner, Lease::DEFAULT_DURATION)
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
    create(&store, &key, other, take_over).await;
    assert_eq!(
        kind(store.renew(&key, &other, lease).await),
        Err(StoreErrorKind::ReservationLost),
        "a completed record has no lease"
    );
    let info = store.inspect(&key).await.unwrap().unwrap();
    assert!(!info.abandoned, "a completed record is never abandoned");
}

/// The owner of a reservation whose lease lapsed, and that nobody took over, still renews and
/// completes it: a lapse only lets another claim take the key over when both allow it. A
/// lease of any length is accepted (the longest ones are clamped, never an overflow).
pub async fn the_owner_writes_after_its_lease_lapsed(store: impl Store) {
    let owner = Reservation::generate();
    let key = lapsed(&store, "lapsed", owner).await;
    store
        .renew(&key, &owner, Lease::MIN_DURATION)
        .await
        .unwrap();
    tokio::time::sleep(Lease::MIN_DURATION * 4).await;
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
