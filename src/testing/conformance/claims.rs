//! The claim: its four answers, at once or awaited, over keys and tokens of every shape, and
//! one new among concurrent claims.

use std::sync::Arc;
use std::time::Duration;

use super::{awkward_response, claim, claim_with, create, fp, lapsed, new, new_with, unique_key};
use crate::store::Store;
use crate::store::{Claim, Lease, Reservation, StoreErrorKind};

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
    create(&store, &key, other, Lease::default()).await;
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
    let key = lapsed(&store, "race-take-over", Reservation::generate()).await;
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
