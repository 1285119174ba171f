//! A create's trailers (a gRPC response's `grpc-status`, say) are stored with its response and
//! written after the body, on the first reply (built from what was stored) and on every replay.

use crate::common;

use std::convert::Infallible;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_idempotency::MemoryStore;
use tower_idempotency::layer::Idempotency;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;

fn grpc_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers.insert("grpc-message", HeaderValue::from_static(""));
    trailers.append("x-trace", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    trailers.append("x-trace", HeaderValue::from_static("b"));
    trailers
}

/// A service whose create answers 201 with `body` and then `trailers`.
fn service(
    store: MemoryStore,
    body: &'static [u8],
    trailers: Option<HeaderMap>,
) -> Idempotency<
    impl tower::Service<
        Request<RequestBody<Chunks>>,
        Response = Response<Trailing>,
        Error = Infallible,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
    MemoryStore,
    LabelContract,
> {
    let create = tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
        let body = Trailing {
            data: Some(Bytes::from_static(body)),
            trailers: trailers.clone().into_iter().collect(),
        };
        async move {
            let mut response = Response::new(body);
            *response.status_mut() = http::StatusCode::CREATED;
            Ok::<_, Infallible>(response)
        }
    });
    tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            store,
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        create,
    )
}

/// The body and the trailers of a response, read to its end.
async fn read<B: Body<Data = Bytes>>(response: Response<B>) -> (Bytes, Option<HeaderMap>)
where
    B::Error: std::fmt::Debug,
{
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (collected.to_bytes(), trailers)
}

#[tokio::test]
async fn a_creates_trailers_are_written_after_its_body_on_the_first_reply_and_every_replay() {
    let store = MemoryStore::new();
    let service = service(store.clone(), b"message", Some(grpc_trailers()));
    for attempt in ["first", "replay", "replay again"] {
        let (body, trailers) = read(service.clone().oneshot(valid()).await.unwrap()).await;
        assert_eq!(body, "message", "{attempt}");
        assert_eq!(trailers, Some(grpc_trailers()), "{attempt}");
    }
    let stored = store.completed(&key_of(KEY)).expect("completed");
    assert_eq!(stored.trailers(), Some(&grpc_trailers()));
}

#[tokio::test]
async fn trailers_after_an_empty_body_and_no_trailers_at_all_are_kept_as_they_are() {
    let store = MemoryStore::new();
    let service_with = service(store.clone(), b"", Some(grpc_trailers()));
    for _ in 0..2 {
        let (body, trailers) = read(service_with.clone().oneshot(valid()).await.unwrap()).await;
        assert!(body.is_empty());
        assert_eq!(trailers, Some(grpc_trailers()));
    }

    let service_without = service(MemoryStore::new(), b"message", None);
    for _ in 0..2 {
        let response = service_without.clone().oneshot(valid()).await.unwrap();
        let (body, trailers) = read(response).await;
        assert_eq!(body, "message");
        assert_eq!(
            trailers, None,
            "no trailers frame where the create sent none"
        );
    }
}

/// Trailers are stored as headers are: every value of every frame, the excluded names left
/// out, and within the response cap.
#[tokio::test]
async fn trailers_are_kept_whole_filtered_and_capped() {
    use tower_idempotency::IdempotencyLayer;
    let mut first = HeaderMap::new();
    first.insert("x", HeaderValue::from_static("1"));
    first.insert("set-cookie", HeaderValue::from_static("secret"));
    let mut second = HeaderMap::new();
    second.insert("x", HeaderValue::from_static("2"));
    let frames = vec![first, second];
    let create = move |size: usize| {
        let frames = frames.clone();
        tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
            let mut frames: std::collections::VecDeque<HeaderMap> = frames.clone().into();
            if size > 0 {
                let big = HeaderValue::from_str(&"v".repeat(size)).unwrap();
                frames[1].insert("x-big", big);
            }
            let body = Trailing {
                data: Some(Bytes::from_static(b"message")),
                trailers: frames,
            };
            async move { Ok::<_, Infallible>(Response::new(body)) }
        })
    };
    let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract)
        .global_keys()
        .exclude_headers([http::header::SET_COOKIE])
        .response_limit(100);
    let service = tower::Layer::layer(&layer, create(0));
    for _ in 0..2 {
        let (_, trailers) = read(service.clone().oneshot(valid()).await.unwrap()).await;
        let trailers = trailers.expect("trailers");
        let xs: Vec<_> = trailers.get_all("x").iter().collect();
        assert_eq!(xs, ["1", "2"], "both frames' values, in order");
        assert!(
            trailers.get("set-cookie").is_none(),
            "excluded as a header would be"
        );
    }

    // A trailer that takes the response over the cap: the response is given whole, with its
    // trailers, and stored as its head alone.
    let layer = IdempotencyLayer::new(MemoryStore::new(), LabelContract)
        .global_keys()
        .response_limit(100);
    let service = tower::Layer::layer(&layer, create(200));
    let response = service.clone().oneshot(valid()).await.unwrap();
    assert_eq!(response.status(), 200);
    let (body, trailers) = read(response).await;
    assert_eq!(body, "message");
    assert_eq!(trailers.expect("trailers")["x-big"].len(), 200);
    let retry = service.oneshot(valid()).await.unwrap();
    assert_eq!(retry.headers()["idempotent-body-omitted"], "true");
    let (body, trailers) = read(retry).await;
    assert_eq!(body, "");
    assert!(trailers.is_none());
}

#[tokio::test]
async fn a_body_with_trailers_claims_no_exact_length_and_one_without_does() {
    // An exact length would have HTTP/1.1 (and tonic-web, which writes the trailers into the
    // body) send a `Content-Length` that leaves the trailers out.
    let with = service(MemoryStore::new(), b"message", Some(grpc_trailers()));
    for attempt in ["first", "replay"] {
        let response = with.clone().oneshot(valid()).await.unwrap();
        let hint = response.body().size_hint();
        assert_eq!(hint.exact(), None, "{attempt}");
        assert_eq!(hint.lower(), 7, "{attempt}");
        assert_eq!(hint.upper(), None, "{attempt}");
    }
    let without = service(MemoryStore::new(), b"message", None);
    for attempt in ["first", "replay"] {
        let response = without.clone().oneshot(valid()).await.unwrap();
        assert_eq!(response.body().size_hint().exact(), Some(7), "{attempt}");
    }
}

/// A response exactly at the cap with its trailers is stored whole; a byte less of cap, and
/// it is given whole but stored as its head.
#[tokio::test]
async fn a_response_at_the_cap_with_its_trailers_is_stored_whole() {
    let trailers = grpc_trailers();
    let trailer_bytes: usize = trailers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    let at_cap = b"message".len() + trailer_bytes;
    for (limit, whole) in [(at_cap, true), (at_cap - 1, false)] {
        let trailers = trailers.clone();
        let create = tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
            let body = Trailing {
                data: Some(Bytes::from_static(b"message")),
                trailers: [trailers.clone()].into(),
            };
            async move { Ok::<_, Infallible>(Response::new(body)) }
        });
        let layer = tower_idempotency::IdempotencyLayer::new(MemoryStore::new(), LabelContract)
            .global_keys()
            .response_limit(limit);
        let service = tower::Layer::layer(&layer, create);
        let (first, _) = read(service.clone().oneshot(valid()).await.unwrap()).await;
        assert_eq!(first, "message");
        let retry = service.oneshot(valid()).await.unwrap();
        let omitted = retry.headers().contains_key("idempotent-body-omitted");
        assert_eq!(omitted, !whole, "cap {limit}");
        let (body, replayed_trailers) = read(retry).await;
        assert_eq!(body.is_empty(), !whole, "cap {limit}");
        assert_eq!(replayed_trailers.is_some(), whole, "cap {limit}");
    }
}
