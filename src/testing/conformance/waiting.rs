//! Waiting for a change: the store's `changed`, and the layer's `pending_wait` on the store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

use super::{awkward_response, fp, new, unique_key};
use crate::store::Store;
use crate::store::{Claim, Operator};

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

/// A `POST /parcels` with the key `key` and any body, as [`RawOperation`] takes it.
///
/// [`RawOperation`]: crate::operation::RawOperation
fn create_request(key: &str) -> http::Request<http_body_util::Full<Bytes>> {
    let mut request =
        http::Request::new(http_body_util::Full::new(Bytes::from_static(b"parcel-42")));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static("/parcels");
    if let Ok(value) = HeaderValue::try_from(key) {
        request
            .headers_mut()
            .insert(crate::operation::IDEMPOTENCY_KEY, value);
    }
    request
}

/// Sends the request of `key` through `service`, checks that it is answered
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
        .oneshot(create_request(key))
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
    let body = String::from_utf8_lossy(&body);
    // The problem's type names the refusal.
    assert!(body.contains("#request_pending\""), "{body}");
    started.elapsed()
}

/// `pending_wait` through the layer on the store: a wait that runs out answers
/// `409 request_pending` after about the wait, and without the setting the `409` is immediate,
/// as the store guide says. One create.
pub async fn a_wait_runs_out_and_without_it_the_409_is_immediate<St: Store>(store: St) {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower::{Layer, ServiceExt};

    use crate::IdempotencyLayer;
    use crate::operation::RawOperation;

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
    let waiting = IdempotencyLayer::new(store.clone(), RawOperation::new())
        .global_keys()
        .pending_wait(Duration::from_millis(200))
        .layer(create.clone());
    let at_once = IdempotencyLayer::new(store, RawOperation::new())
        .global_keys()
        .layer(create);
    let key = unique_key("runs-out");
    let first = tokio::spawn(waiting.clone().oneshot(create_request(&key)));
    // Until the first attempt's create runs (its claim was new), however long the store's
    // first connection takes to make; the create then runs 900 ms.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while creates.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first attempt never created"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
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
