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
//! The `examples/toy-store` crate in the repository is a complete worked example: a store written with the
//! public API alone that passes the suite.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::operation::Fingerprint;
use crate::store::Store;
use crate::store::{Claim, Lease, Reservation, StoredResponse};

mod claims;
mod operator;
mod records;
mod run;
mod tombstones;
mod waiting;

pub use self::claims::*;
pub use self::operator::*;
pub use self::records::*;
pub use self::run::*;
pub use self::tombstones::*;
pub use self::waiting::*;

/// A key no other test (or earlier run) uses.
pub fn unique_key(name: &str) -> String {
    format!("{name}-{}", Reservation::generate())
}

pub(super) fn fp(parcel: &str) -> Fingerprint {
    Fingerprint::digest(["conformance", parcel])
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

pub(super) async fn new(store: &impl Store, key: &str, fingerprint: &Fingerprint) -> Reservation {
    match store.claim(key, fingerprint).await.unwrap() {
        Claim::New(reservation) => reservation,
        other => panic!("expected new, got {other:?}"),
    }
}

/// Claims `key` for the operation `"a"` under `owner`, a new claim, and completes it with
/// [`awkward_response`].
pub(super) async fn create(store: &impl Store, key: &str, owner: Reservation, lease: Lease) {
    let claimed = claim_with(store, key, "a", owner, lease).await;
    assert_eq!(claimed, Claim::New(owner));
    let completed = store.complete(key, &owner, &awkward_response()).await;
    completed.unwrap();
}

/// A new key named after `name`, claimed for the operation `"a"` by `owner` with the shortest
/// lease, one its claimer lets be taken over, once that lease has lapsed.
pub(super) async fn lapsed(store: &impl Store, name: &str, owner: Reservation) -> String {
    let key = unique_key(name);
    let lease = Lease::new(Lease::MIN_DURATION).take_over_abandoned();
    let claimed = claim_with(store, &key, "a", owner, lease).await;
    assert_eq!(claimed, Claim::New(owner));
    tokio::time::sleep(Lease::MIN_DURATION * 4).await;
    key
}

/// A claim of `key` for the operation `parcel`, with the caller's token and lease.
pub(super) async fn claim_with(
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

pub(super) async fn claim(store: &impl Store, key: &str, fingerprint: &Fingerprint) -> Claim {
    store.claim(key, fingerprint).await.unwrap()
}

pub(super) async fn new_with(store: &impl Store, key: &str, token: Reservation) {
    assert_eq!(
        claim_with(store, key, "a", token, Lease::default()).await,
        Claim::New(token)
    );
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
            async fn a_response_over_the_cap_is_given_whole_and_its_retry_gets_its_head() {
                suite::a_response_over_the_cap_is_given_whole_and_its_retry_gets_its_head($make(::core::option::Option::None).await).await;
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

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_run_is_done_once_then_replayed() {
                suite::a_run_is_done_once_then_replayed($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_run_with_another_fingerprint_conflicts() {
                suite::a_run_with_another_fingerprint_conflicts($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_run_while_another_runs_is_pending_or_waits() {
                suite::a_run_while_another_runs_is_pending_or_waits($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_lapsed_run_is_taken_over_only_when_asked() {
                suite::a_lapsed_run_is_taken_over_only_when_asked($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lost_run_answers_are_settled() {
                suite::lost_run_answers_are_settled($make(::core::option::Option::None).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failed_and_panicking_runs_keep_or_release_their_key() {
                suite::failed_and_panicking_runs_keep_or_release_their_key($make(::core::option::Option::None).await).await;
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

/// Instantiates the [conformance suite](crate::testing::conformance)'s tombstone properties
/// for a store that keeps tombstones ([`Store::tombstone_window`](crate::store::Store::tombstone_window)):
/// one `#[tokio::test]` per property, in a module `tombstone_conformance`.
///
/// `$make` is an `async fn(StoreOptions) -> St` where `St:`
/// [`Operator`](crate::store::Operator) `+` [`Purge`](crate::store::Purge), the store built
/// with those options; `retention = …` and `tombstones = …` are the windows the properties
/// give it: the retention long enough for a round trip to the store, the tombstone window
/// long enough for 16 concurrent claims besides, both short enough to wait for.
///
/// ```ignore
/// tower_idempotency::tombstone_conformance!(
///     make_store,
///     retention = Duration::from_millis(200),
///     tombstones = Duration::from_secs(2),
/// );
/// ```
#[macro_export]
macro_rules! tombstone_conformance {
    ($make:path, retention = $retention:expr, tombstones = $tombstones:expr $(,)?) => {
        mod tombstone_conformance {
            #[allow(unused_imports)]
            use super::*;
            use $crate::testing::conformance as suite;

            fn options() -> $crate::store::StoreOptions {
                $crate::store::StoreOptions::new()
                    .retention($retention)
                    .tombstones($tombstones)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_expired_key_is_refused_until_its_tombstone_ends() {
                suite::an_expired_key_is_refused_until_its_tombstone_ends(
                    $make(options()).await,
                    $retention,
                    $tombstones,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn purge_keeps_tombstones_until_their_window_ends() {
                suite::purge_keeps_tombstones_until_their_window_ends(
                    $make(options()).await,
                    $retention,
                    $tombstones,
                )
                .await;
            }
        }
    };
}
