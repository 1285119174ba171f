//! What every bench sends and the create it guards: the label contract's operation and response.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::Full;
use tower::Service;
use tower_idempotency::store::{Claim, Lease, Reservation, StoreError, StoredResponse};

#[path = "../../tests/common/labels.rs"]
mod labels;
pub mod reference;

/// The label contract's create, answering at once: 201, `Content-Type`, `Location`, two `ETag`s.
#[derive(Clone, Copy, Debug, Default)]
pub struct Create;

impl<B> Service<Request<B>> for Create {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        std::future::ready(Ok(labels::created_response()))
    }
}

/// The label contract's created response, as [`Create`] answers it.
pub fn created() -> Response<Full<Bytes>> {
    labels::created_response()
}

/// `POST /labels` with a key, a content type and a body.
pub fn request(
    key: &str,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    Request::post("/labels")
        .header(header::CONTENT_TYPE, content_type)
        .header("idempotency-key", key)
        .body(Full::new(body.into()))
        .expect("a valid request")
}

/// A valid attempt of the operation `key` for `parcel-42`.
pub fn valid(key: &str) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"request_id":"{key}","parcel_id":"parcel-42"}}"#);
    request(key, "application/json", body)
}

/// The typed body of the generic JSON rows.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct NewPayment {
    pub amount: u64,
    pub currency: String,
    #[serde(default)]
    pub reference: Option<String>,
}

/// The body of the generic JSON rows: a payment with a reference.
pub const PAYMENT: &str =
    r#"{"amount":1250,"currency":"EUR","reference":"order 7 of customer 42"}"#;

/// `POST /payments` with a key and the payment body.
pub fn payment(key: &str) -> Request<Full<Bytes>> {
    Request::post("/payments")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(PAYMENT.as_bytes())))
        .expect("a valid request")
}

/// The generic JSON layer with a typed, validated body over `store`, around [`Create`].
pub fn json_service<St: tower_idempotency::store::Store>(
    store: St,
) -> tower_idempotency::layer::Idempotency<
    Create,
    St,
    tower_idempotency::JsonOperation<NewPayment>,
    tower_idempotency::admission::AlwaysAdmit,
> {
    let operation = tower_idempotency::JsonOperation::<NewPayment>::typed().validate(|p| {
        if p.amount >= 1 {
            Ok(())
        } else {
            Err("amount must be at least 1".into())
        }
    });
    let layer = tower_idempotency::IdempotencyLayer::new(store, operation).global_keys();
    tower::Layer::layer(&layer, Create)
}

/// Replays of `key` through `service`, measured as `name` in `group`: the key is sent once
/// first, so that every measured request replays it.
pub fn replays<S, B>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    service: &S,
    key: &str,
) where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    runtime
        .block_on(service.clone().oneshot(valid(key)))
        .expect("the first attempt");
    group.bench_function(name, |b| {
        b.to_async(runtime).iter_batched(
            || valid(key),
            |request| async {
                let response = service.clone().oneshot(request).await.expect("a reply");
                std::hint::black_box(response.into_body().collect().await.ok())
            },
            criterion::BatchSize::SmallInput,
        );
    });
}

/// A store that keeps nothing: every claim new, every complete accepted. Not a store anyone
/// should run, but the floor of what the layer costs with any store: its own steps (the body
/// read, the parse, the fingerprint, the key, the decision, the response read and handed
/// back), with the store's work taken out. The comparison harness and the load run's `floor`
/// server measure it beside the memory store.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeepsNothing;

impl tower_idempotency::store::Store for KeepsNothing {
    fn claim_with(
        &self,
        _: &str,
        _: &tower_idempotency::operation::Fingerprint,
        reservation: Reservation,
        _: Lease,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        std::future::ready(Ok(Claim::New(reservation)))
    }

    fn claim_now(
        &self,
        _: &str,
        _: &tower_idempotency::operation::Fingerprint,
        reservation: Reservation,
        _: Lease,
    ) -> Option<Result<Claim, StoreError>> {
        Some(Ok(Claim::New(reservation)))
    }

    fn renew(
        &self,
        _: &str,
        _: &Reservation,
        _: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    fn complete(
        &self,
        _: &str,
        _: &Reservation,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::hint::black_box(response);
        std::future::ready(Ok(()))
    }

    fn release(
        &self,
        _: &str,
        _: &Reservation,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}
