//! The generic JSON operation's test rig: a typed payment create behind `JsonOperation`, and
//! the scenarios every store runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use serde::Deserialize;
use tower::ServiceExt;
use tower_idempotency::admission::AlwaysAdmit;
use tower_idempotency::layer::Idempotency;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::reply::Invalid;
use tower_idempotency::reply::Outcome;
use tower_idempotency::store::Store;
use tower_idempotency::{IdempotencyLayer, JsonOperation};

use super::{Chunks, CreateError, Inner, Reply};

/// The payment body of the generic tests.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NewPayment {
    pub amount: u64,
    pub currency: String,
    #[serde(default)]
    pub reference: Option<String>,
}

/// The typed operation: amount at least 1, three uppercase letters of currency.
pub fn payment_operation() -> JsonOperation<NewPayment> {
    JsonOperation::<NewPayment>::typed().validate(|payment| {
        if payment.amount < 1 {
            Err(Invalid::at("/amount", "must be at least 1"))
        } else if payment.currency.len() != 3
            || !payment.currency.bytes().all(|b| b.is_ascii_uppercase())
        {
            Err("currency must be three uppercase letters".into())
        } else {
            Ok(())
        }
    })
}

pub type PaymentService<St, O = JsonOperation<NewPayment>> = Idempotency<Inner, St, O, AlwaysAdmit>;

/// A create that counts, takes `delay`, and answers 201 with the payment it got in the
/// extensions (or the path, for an untyped operation), numbered by its count.
pub fn payment_create(creates: Arc<AtomicUsize>, delay: Duration) -> Inner {
    Inner::new(tower::service_fn(
        move |request: Request<RequestBody<Chunks>>| {
            let n = creates.fetch_add(1, Ordering::SeqCst) + 1;
            let payment = request.extensions().get::<NewPayment>().cloned();
            let path = request.uri().path().to_owned();
            async move {
                tokio::time::sleep(delay).await;
                let body = match payment {
                    Some(p) => format!(
                        r#"{{"payment_id":"pay_{n}","amount":{},"currency":"{}"}}"#,
                        p.amount, p.currency
                    ),
                    None => format!(r#"{{"created":{n},"path":"{path}"}}"#),
                };
                let response = Response::builder()
                    .status(StatusCode::CREATED)
                    .header("content-type", "application/json")
                    .header("location", format!("/payments/pay_{n}"))
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                Ok::<_, CreateError>(response)
            }
        },
    ))
}

/// The typed payment layer over `store` (global keys) around a counting create.
pub fn payments<St: Store>(store: St, delay: Duration) -> (PaymentService<St>, Arc<AtomicUsize>) {
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store, payment_operation()).global_keys();
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), delay));
    (service, creates)
}

/// `method path` with a key (sent as given) and a JSON body.
pub fn json_request(method: &str, path: &str, key: Option<&str>, body: &str) -> Request<Chunks> {
    super::request(method, path, key, Some("application/json"), body.to_owned())
}

/// Sends one request and reads the reply whole.
pub async fn send<S>(service: &S, request: Request<Chunks>) -> Reply
where
    S: tower::Service<
            Request<Chunks>,
            Response = Response<tower_idempotency::layer::ResponseBody<Full<Bytes>>>,
        > + Clone,
    S::Error: std::fmt::Debug,
{
    Reply::read(service.clone().oneshot(request).await.unwrap()).await
}

impl Reply {
    /// Asserts a problem reply: status, `Content-Type: application/problem+json`, and the
    /// problem's `type` fragment, `title`, `status` and (if given) `detail`.
    #[track_caller]
    pub fn problem(&self, status: u16, case: &str, detail: Option<&str>) -> &Self {
        assert_eq!(self.status.as_u16(), status, "status; body {:?}", self.body);
        assert_eq!(
            self.values("content-type"),
            ["application/problem+json"],
            "content-type"
        );
        let problem: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        let object = problem.as_object().unwrap();
        let mut members: Vec<_> = object
            .keys()
            .map(String::as_str)
            .filter(|member| *member != "errors")
            .collect();
        members.sort_unstable();
        assert_eq!(members, ["detail", "status", "title", "type"], "{problem}");
        assert_eq!(
            problem["type"],
            format!(
                "https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#{case}"
            )
        );
        assert_eq!(problem["status"], status);
        assert!(!problem["title"].as_str().unwrap().is_empty());
        if let Some(detail) = detail {
            assert_eq!(problem["detail"], detail, "detail");
        }
        self
    }

    /// A `400 invalid_request` about the member at `pointer`: the pointer leads its
    /// `detail`, and its `errors` hold the pointer and the detail, machine-readable.
    pub fn invalid_at(&self, pointer: &str, detail: &str) -> &Self {
        self.problem(
            400,
            "invalid_request",
            Some(&format!("{pointer}: {detail}")),
        );
        let problem: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        assert_eq!(
            problem["errors"],
            serde_json::json!([{ "pointer": pointer, "detail": detail }]),
            "{problem}"
        );
        self
    }

    /// A `400 invalid_request` about the whole body: `detail`, and no `errors`.
    pub fn invalid(&self, detail: &str) -> &Self {
        self.problem(400, "invalid_request", Some(detail));
        let problem: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        assert_eq!(problem.get("errors"), None, "{problem}");
        self
    }
}

/// The generic operation on `store`: 1,000 concurrent identical requests create once; every
/// answer is the one created response or `request_pending`; a retry spelled differently
/// replays; another payload under the key is `422`.
pub async fn generic_mode_creates_once<St: Store>(store: St, n: usize) {
    let (service, creates) = payments(store, Duration::from_millis(50));
    let key = super::conformance::unique_key("pay");
    let body = r#"{"amount":1250,"currency":"EUR","reference":"order 7"}"#;
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let service = service.clone();
            let request = json_request("POST", "/payments", Some(&key), body);
            tokio::spawn(async move { send(&service, request).await })
        })
        .collect();
    let mut created = None;
    let (mut pending, mut answered) = (0, 0);
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.outcome {
            Some(Outcome::Created | Outcome::Replay) => {
                assert_eq!(reply.status, 201);
                let first = created.get_or_insert_with(|| reply.body.clone());
                assert_eq!(&reply.body, first, "one created response");
                answered += 1;
            }
            Some(Outcome::Pending) => {
                reply.problem(409, "request_pending", None);
                pending += 1;
            }
            other => panic!("unexpected {other:?}: {:?}", reply.body),
        }
    }
    assert_eq!(creates.load(Ordering::SeqCst), 1, "exactly one create");
    assert_eq!(answered + pending, n);
    let reordered = r#"{ "reference" : "order\u0020\u0037", "currency":"EUR", "amount" : 1250 }"#;
    let replay = send(
        &service,
        json_request("POST", "/payments", Some(&format!("\"{key}\"")), reordered),
    )
    .await;
    assert_eq!(replay.outcome, Some(Outcome::Replay));
    assert_eq!(Some(replay.body), created);
    let other = r#"{"amount":1251,"currency":"EUR","reference":"order 7"}"#;
    send(
        &service,
        json_request("POST", "/payments", Some(&key), other),
    )
    .await
    .problem(422, "idempotency_conflict", None);
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// The generic operation on `store`: a client that goes away right after its request was
/// claimed still gets its create completed, and the retry replays it.
pub async fn generic_mode_survives_a_disconnect<St: Store>(store: St) {
    let (service, creates) = payments(store, Duration::from_millis(100));
    let key = super::conformance::unique_key("gone");
    let body = r#"{"amount":5,"currency":"USD"}"#;
    let mut held = service.clone();
    let future = super::call(
        &mut held,
        json_request("POST", "/payments", Some(&key), body),
    )
    .await;
    let mut future = Box::pin(future);
    // Poll until the create has started, then drop the future: the client went away.
    tokio::select! {
        _ = &mut future => panic!("the create takes 100 ms"),
        () = super::wait_for(|| creates.load(Ordering::SeqCst) == 1) => {}
    }
    drop(future);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let reply = send(
            &service,
            json_request("POST", "/payments", Some(&key), body),
        )
        .await;
        if reply.outcome == Some(Outcome::Replay) {
            assert_eq!(reply.status, 201);
            assert_eq!(
                reply.body,
                r#"{"payment_id":"pay_1","amount":5,"currency":"USD"}"#
            );
            break;
        }
        reply.problem(409, "request_pending", None);
        assert!(std::time::Instant::now() < deadline, "never completed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// `operation` on a fresh memory store (global keys) around a counting create.
pub fn guarded<O: tower_idempotency::operation::Operation>(
    operation: O,
) -> (
    PaymentService<tower_idempotency::MemoryStore, O>,
    Arc<AtomicUsize>,
) {
    let creates = Arc::new(AtomicUsize::new(0));
    let layer =
        IdempotencyLayer::new(tower_idempotency::MemoryStore::new(), operation).global_keys();
    let service = tower::Layer::layer(&layer, payment_create(Arc::clone(&creates), Duration::ZERO));
    (service, creates)
}

/// What the layer did with one request.
pub async fn outcome<S>(service: &S, request: Request<Chunks>) -> Option<Outcome>
where
    S: tower::Service<
            Request<Chunks>,
            Response = Response<tower_idempotency::layer::ResponseBody<Full<Bytes>>>,
        > + Clone,
    S::Error: std::fmt::Debug,
{
    send(service, request).await.outcome
}
