//! Records: what is stored is replayed byte for byte, a reservation guards every write, and
//! retention drops completed records only.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

use super::{awkward_response, claim, fp, new, unique_key};
use crate::store::Store;
use crate::store::{Claim, Reservation, StoreErrorKind, StoredResponse};

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
    // A store that advertises its replay window advertises this one (remote stores keep whole
    // milliseconds).
    if let Some(window) = store.replay_window() {
        assert_eq!(
            window.as_millis(),
            retention.as_millis(),
            "the replay window"
        );
    }
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
    if store.tombstone_window().is_some() {
        // Remembered past its window: still the key of its operation, which is not created
        // again.
        assert_eq!(
            claim(&store, &completed, &fp("b")).await,
            Claim::Conflict,
            "a tombstone keeps its fingerprint"
        );
        assert!(
            matches!(claim(&store, &completed, &fp("a")).await, Claim::Expired(_)),
            "an expired completed record is a tombstone"
        );
    } else {
        assert!(
            matches!(claim(&store, &completed, &fp("b")).await, Claim::New(_)),
            "an expired completed record is gone"
        );
    }
    assert_eq!(
        claim(&store, &pending, &fp("a")).await,
        Claim::Pending,
        "pending never expires"
    );
}

/// A body of `count` chunks of `size` bytes each (byte `i` of the whole is `i % 251`), its
/// length not declared.
struct Chunks {
    count: usize,
    size: usize,
    sent: usize,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.sent == self.count {
            return std::task::Poll::Ready(None);
        }
        let start = self.sent * self.size;
        let chunk: Vec<u8> = (start..start + self.size)
            .map(|i| (i % 251) as u8)
            .collect();
        self.sent += 1;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(chunk)))))
    }
}

/// Through the layer, a create that answers 2 MiB, twice the default cap: the first client
/// gets all of it with its status and headers; the key is completed with the compact record,
/// so a retry gets the status, `Location` and `Idempotent-Body-Omitted: true` with an empty
/// body; one create.
pub async fn a_response_over_the_cap_is_given_whole_and_its_retry_gets_its_head(store: impl Store) {
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    let creates = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&creates);
    let create = tower::service_fn(move |_: http::Request<crate::body::RequestBody<String>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            let mut response = http::Response::new(Chunks {
                count: 32,
                size: 64 * 1024,
                sent: 0,
            });
            *response.status_mut() = StatusCode::CREATED;
            let headers = response.headers_mut();
            headers.insert(
                http::header::LOCATION,
                HeaderValue::from_static("/parcels/big"),
            );
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(
                http::header::CONTENT_LENGTH,
                HeaderValue::from_static("2097152"),
            );
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let service = tower::Layer::layer(
        &crate::IdempotencyLayer::new(store, crate::operation::RawOperation::new()).global_keys(),
        create,
    );
    let key = HeaderValue::try_from(unique_key("over-cap")).expect("a key is a header value");
    let send = || async {
        let mut request = http::Request::post("/parcels")
            .body(String::from("parcel-big"))
            .expect("a request");
        request
            .headers_mut()
            .insert(crate::operation::IDEMPOTENCY_KEY, key.clone());
        let response = service.clone().oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let outcome = body.outcome();
        let body = body.collect().await.unwrap().to_bytes();
        (parts, outcome, body)
    };
    let (first, outcome, body) = send().await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(outcome, Some(crate::reply::Outcome::Created));
    assert_eq!(first.headers["location"], "/parcels/big");
    assert_eq!(first.headers["content-length"], "2097152");
    assert!(!first.headers.contains_key("idempotent-body-omitted"));
    assert_eq!(body.len(), 2 * 1024 * 1024);
    assert!(body.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));

    let (retry, outcome, body) = send().await;
    assert_eq!(outcome, Some(crate::reply::Outcome::Replay));
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.headers["location"], "/parcels/big");
    assert_eq!(retry.headers["content-type"], "application/octet-stream");
    assert_eq!(retry.headers["idempotent-body-omitted"], "true");
    assert!(!retry.headers.contains_key("content-length"));
    assert!(body.is_empty());
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}
