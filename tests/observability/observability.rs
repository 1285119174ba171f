//! Tracing, the outcome extension, and the opt-in replay marker.

use crate::common;

use std::cell::RefCell;
use std::sync::{Arc, Mutex, Once};

use common::*;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::reply::Outcome;
use tower_idempotency::scope::GlobalKeys;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};

thread_local! {
    /// Every span field and event field recorded on this thread, as `name=value` lines.
    static LINES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Records into the thread's [`LINES`]. Installed once as the global subscriber, so that
/// tracing's per-callsite interest never depends on which test thread got there first; each
/// test runs on its own thread (current-thread runtime) and reads only its own lines.
struct Recorder;

struct Lines<'a>(&'a mut Vec<String>);

impl Visit for Lines<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={:?}", field.name(), value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push(format!("{}={value}", field.name()));
    }
}

fn record(visit: impl FnOnce(&mut Lines<'_>)) {
    LINES.with(|lines| visit(&mut Lines(&mut lines.borrow_mut())));
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        record(|lines| attrs.record(lines));
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        record(|lines| values.record(lines));
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        record(|lines| event.record(lines));
    }
}

/// This thread's recorded lines.
struct Recorded;

impl Recorded {
    fn take(&self) -> Vec<String> {
        LINES.with(|lines| std::mem::take(&mut *lines.borrow_mut()))
    }
}

/// Installs the recorder, before any test of this file traces anything.
fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(Recorder);
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
    });
}

async fn traced(
    configure: impl FnOnce(
        RigLayer,
    ) -> IdempotencyLayer<
        RecordingStore,
        LabelContract,
        ScriptedAdmission,
        GlobalKeys,
    >,
) -> (Rig, Recorded) {
    install();
    Recorded.take();
    (Rig::with_layer(configure), Recorded)
}

#[tokio::test]
async fn every_request_has_a_span_with_its_outcome_and_fingerprint_never_its_body() {
    let (rig, recorded) = traced(|layer| layer).await;
    rig.send(valid()).await.is_created();
    let lines = recorded.take();
    let fingerprint = format!(
        "fingerprint={}",
        tower_idempotency::operation::LabelContract::fingerprint(KEY, "parcel-42")
    );
    for expected in [
        "outcome=created",
        "path=/labels",
        "method=POST",
        fingerprint.as_str(),
    ] {
        assert!(
            lines.iter().any(|l| l == expected),
            "{expected} in {lines:?}"
        );
    }
    assert!(
        !lines.iter().any(|l| l.starts_with("key=")),
        "no key unless configured: {lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("parcel-42")),
        "never the body: {lines:?}"
    );

    for (request, outcome) in [
        (valid(), "outcome=replay"),
        (operation(KEY, "parcel-43"), "outcome=conflict"),
        (
            request("GET", "/labels", None, None, ""),
            "outcome=rejected",
        ),
    ] {
        rig.send(request).await;
        let lines = recorded.take();
        assert!(lines.iter().any(|l| l == outcome), "{outcome} in {lines:?}");
    }
    rig.store.fail("claim");
    rig.send(operation("other", "p")).await;
    assert!(
        recorded
            .take()
            .iter()
            .any(|l| l == "outcome=store_unavailable")
    );
}

#[tokio::test]
async fn the_key_is_traced_only_where_configured() {
    let (rig, recorded) = traced(|layer| layer.trace_keys(true)).await;
    rig.send(valid()).await;
    let key = format!("key={}", key_of(KEY));
    assert!(recorded.take().contains(&key));
}

/// The outcomes of a series of responses, in order.
type Outcomes = Vec<Option<Outcome>>;

/// What an outer layer counts, in order, from the body of every response (always) and from
/// the extensions (only where the layer is asked to put it there).
async fn outcomes_seen_by_an_outer_layer(rig: &Rig) -> (Outcomes, Outcomes) {
    let counted: Arc<Mutex<(Outcomes, Outcomes)>> = Arc::default();
    let seen = Arc::clone(&counted);
    let service = ServiceBuilder::new()
        .map_response(
            move |response: http::Response<tower_idempotency::layer::ResponseBody<_>>| {
                let mut seen = seen.lock().unwrap();
                seen.0.push(response.body().outcome());
                seen.1.push(response.extensions().get::<Outcome>().copied());
                response
            },
        )
        .service(rig.service.clone());
    for request in [
        valid(),
        valid(),
        operation(KEY, "x"),
        request("PUT", "/labels", None, None, ""),
    ] {
        Reply::read(service.clone().oneshot(request).await.unwrap()).await;
    }
    let counted = counted.lock().unwrap();
    (counted.0.clone(), counted.1.clone())
}

const OUTCOMES: [Option<Outcome>; 4] = [
    Some(Outcome::Created),
    Some(Outcome::Replay),
    Some(Outcome::Conflict),
    Some(Outcome::Rejected(http::StatusCode::METHOD_NOT_ALLOWED)),
];

#[tokio::test]
async fn an_outer_layer_counts_outcomes_from_the_body_and_by_default_not_the_extensions() {
    install();
    let (bodies, extensions) = outcomes_seen_by_an_outer_layer(&Rig::new()).await;
    assert_eq!(bodies, OUTCOMES);
    assert_eq!(extensions, [None; 4], "no extension unless asked");
}

#[tokio::test]
async fn with_outcome_extension_an_outer_layer_counts_them_from_the_extensions_too() {
    install();
    let rig = Rig::with_layer(|layer| layer.outcome_extension(true));
    let (bodies, extensions) = outcomes_seen_by_an_outer_layer(&rig).await;
    assert_eq!(bodies, OUTCOMES);
    assert_eq!(extensions, OUTCOMES);
}

#[tokio::test]
async fn the_replay_marker_is_off_by_default_and_marks_replays_only() {
    install();
    let rig = Rig::new();
    rig.send(valid()).await;
    assert!(
        rig.send(valid())
            .await
            .headers
            .get("idempotent-replayed")
            .is_none()
    );

    let rig = Rig::with_layer(|layer| layer.mark_replays(true));
    let first = rig.send(valid()).await;
    first.is_created();
    let replay = rig.send(valid()).await;
    assert_eq!(replay.values("idempotent-replayed"), ["true"]);
    assert_eq!(replay.body, first.body);
}

/// Metrics, read as an operator scrapes them: Prometheus text from a recorder of the test's
/// own (local to the test's thread, which runs the whole test on a current-thread runtime).
#[cfg(feature = "metrics")]
mod metrics {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
    use tower::{BoxError, Layer, ServiceExt, service_fn};
    use tower_idempotency::admission::{Admit, Refusal, admit_fn};
    use tower_idempotency::layer::RequestBody;
    use tower_idempotency::metrics::{REQUESTS, STORE_CALL_SECONDS, WAITING};
    use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

    /// A recorder for this thread, and its scrape.
    fn recorder() -> (metrics::LocalRecorderGuard<'static>, PrometheusHandle) {
        let recorder = Box::leak(Box::new(PrometheusBuilder::new().build_recorder()));
        let handle = recorder.handle();
        (metrics::set_default_local_recorder(recorder), handle)
    }

    /// The value of the series `name` whose labels include `labels`, in `scrape`.
    fn value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        scrape
            .lines()
            .filter(|line| line.starts_with(&format!("{name}{{")))
            .find(|line| {
                labels
                    .iter()
                    .all(|(label, value)| line.contains(&format!("{label}=\"{value}\"")))
            })
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
    }

    /// A create that answers `201` once `gate` lets it.
    fn gated_create(
        gate: Arc<tokio::sync::Notify>,
    ) -> impl tower::Service<
        Request<RequestBody<Full<Bytes>>>,
        Response = Response<Full<Bytes>>,
        Error = BoxError,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        service_fn(move |_: Request<RequestBody<Full<Bytes>>>| {
            let held = Arc::clone(&gate);
            async move {
                held.notified().await;
                let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
                *response.status_mut() = StatusCode::CREATED;
                Ok::<_, BoxError>(response)
            }
        })
    }

    fn payment(key: &str, body: &'static str) -> Request<Full<Bytes>> {
        Request::post("/payments")
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    }

    /// A scripted run through a layer labelled `payments`: each outcome counter, by status,
    /// is the run's count of it, and each store call is timed once per call made.
    #[tokio::test]
    async fn each_outcome_counter_equals_the_runs_count() {
        let (_guard, scrape) = recorder();
        let creates = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&creates);
        let gate = Arc::new(tokio::sync::Notify::new());
        let held = Arc::clone(&gate);
        let create = service_fn(move |request: Request<RequestBody<Full<Bytes>>>| {
            let (counted, held) = (Arc::clone(&counted), Arc::clone(&held));
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                let body = request.into_body().collect().await?.to_bytes();
                if body.as_ref() == br#"{"fail":true}"# {
                    return Err::<Response<Full<Bytes>>, BoxError>("the create failed".into());
                }
                if body.as_ref() == br#"{"hold":true}"# {
                    held.notified().await;
                }
                let mut response = Response::new(Full::new(body));
                *response.status_mut() = StatusCode::CREATED;
                Ok(response)
            }
        });
        let admission = admit_fn(|value: &serde_json::Value| {
            let refuse = value.get("busy").is_some();
            async move {
                match refuse {
                    true => Admit::Refuse(Refusal::TooManyRequests),
                    false => Admit::Proceed(()),
                }
            }
        });
        let operation = JsonOperation::<serde_json::Value>::typed();
        let service = IdempotencyLayer::new(MemoryStore::new(), operation)
            .global_keys()
            .admission(admission)
            .metrics_label("payments")
            .layer(create);
        let send = |request: Request<Full<Bytes>>| service.clone().oneshot(request);
        // The status of a payment `body` under `key`.
        let status = |key, body| {
            let answer = send(payment(key, body));
            async move { answer.await.unwrap().status().as_u16() }
        };
        // Three created, two of them replayed, one conflict.
        for key in ["a", "b", "c", "a", "b"] {
            assert_eq!(status(key, r#"{"amount":1}"#).await, 201);
        }
        assert_eq!(status("a", r#"{"amount":2}"#).await, 422);
        // One held while a retry finds it pending; then created.
        let first = tokio::spawn(send(payment("held", r#"{"hold":true}"#)));
        while creates.load(Ordering::SeqCst) < 4 {
            tokio::task::yield_now().await;
        }
        assert_eq!(status("held", r#"{"hold":true}"#).await, 409);
        gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap().status(), 201);
        // Refused: by admission (429, released), by validation (400, 415); a create that fails.
        assert_eq!(status("busy", r#"{"busy":1}"#).await, 429);
        assert_eq!(status("bad", "{").await, 400);
        let mut text = payment("text", "{}");
        text.headers_mut()
            .insert("content-type", "text/plain".parse().unwrap());
        assert_eq!(send(text).await.unwrap().status(), 415);
        assert_eq!(status("fail", r#"{"fail":true}"#).await, 500);

        let scrape = scrape.render();
        let count = |outcome: &str, status: &str| {
            let labels = [
                ("layer", "payments"),
                ("outcome", outcome),
                ("status", status),
            ];
            value(&scrape, REQUESTS, &labels)
        };
        for (outcome, status, expected) in [
            ("created", "201", 4.0),
            ("replay", "201", 2.0),
            ("conflict", "422", 1.0),
            ("pending", "409", 1.0),
            ("not_admitted", "429", 1.0),
            ("rejected", "400", 1.0),
            ("rejected", "415", 1.0),
            ("create_failed", "500", 1.0),
        ] {
            assert_eq!(
                count(outcome, status),
                Some(expected),
                "{outcome} {status}\n{scrape}"
            );
        }
        let total: f64 = scrape
            .lines()
            .filter(|line| line.starts_with(&format!("{REQUESTS}{{")))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(total, 12.0, "every request counted once\n{scrape}");
        // Claimed: every request past validation (10); completed: the four created; released:
        // the refused one.
        let calls = |call: &str| {
            let name = format!("{STORE_CALL_SECONDS}_count");
            value(&scrape, &name, &[("layer", "payments"), ("call", call)])
        };
        assert_eq!(calls("claim"), Some(10.0), "{scrape}");
        assert_eq!(calls("complete"), Some(4.0), "{scrape}");
        assert_eq!(calls("release"), Some(1.0), "{scrape}");
    }

    /// A request whose client went away mid-create is finished in a task of its own, and its
    /// outcome counted all the same.
    #[tokio::test]
    async fn the_outcome_of_a_request_whose_client_left_is_counted() {
        let (_guard, scrape) = recorder();
        let gate = Arc::new(tokio::sync::Notify::new());
        let create = gated_create(Arc::clone(&gate));
        let store = MemoryStore::new();
        let mut service = IdempotencyLayer::new(store.clone(), JsonOperation::new())
            .global_keys()
            .metrics_label("left")
            .layer(create);
        let call = tower::Service::call(&mut service, payment("k", "{}"));
        let mut call = Box::pin(call);
        // Polled until it waits for its create, then dropped: the client went away.
        let polled = futures_poll(call.as_mut());
        assert!(polled.is_pending());
        drop(call);
        gate.notify_one();
        while store.completed("POST /payments k").is_none() {
            tokio::task::yield_now().await;
        }
        let created = [("layer", "left"), ("outcome", "created"), ("status", "201")];
        let counted = async {
            while value(&scrape.render(), REQUESTS, &created).is_none() {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), counted)
            .await
            .expect("counted");
        assert_eq!(value(&scrape.render(), REQUESTS, &created), Some(1.0));
    }

    /// Polls `future` once.
    fn futures_poll<F: std::future::Future>(
        future: std::pin::Pin<&mut F>,
    ) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        future.poll(&mut std::task::Context::from_waker(waker))
    }

    /// The requests waiting for a pending key's first attempt, as a gauge: one while a
    /// retry waits, none once it has its answer.
    #[tokio::test]
    async fn the_waiting_gauge_counts_requests_waiting_for_a_first_attempt() {
        let (_guard, scrape) = recorder();
        let gate = Arc::new(tokio::sync::Notify::new());
        let create = gated_create(Arc::clone(&gate));
        let service = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
            .global_keys()
            .pending_wait(Duration::from_secs(30))
            .metrics_label("waiting")
            .layer(create);
        let waiting = || value(&scrape.render(), WAITING, &[("layer", "waiting")]);
        let first = tokio::spawn(service.clone().oneshot(payment("k", "{}")));
        tokio::task::yield_now().await;
        let retry = tokio::spawn(service.clone().oneshot(payment("k", "{}")));
        while waiting() != Some(1.0) {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap().status(), 201);
        assert_eq!(retry.await.unwrap().unwrap().status(), 201);
        assert_eq!(waiting(), Some(0.0));
    }

    /// The client layer's attempts, first and retries, and the retries its budget refused.
    #[cfg(feature = "client")]
    #[tokio::test(start_paused = true)]
    async fn the_client_layer_counts_its_attempts_and_budget_refusals() {
        use tower::retry::budget::TpsBudget;
        use tower_idempotency::client::ClientLayer;
        use tower_idempotency::metrics::{CLIENT_ATTEMPTS, CLIENT_BUDGET_REFUSALS};

        let (_guard, scrape) = recorder();
        let answers = Arc::new(AtomicUsize::new(0));
        // 503, 503, then 201.
        let server = service_fn(move |_: Request<Full<Bytes>>| {
            let n = answers.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = if n < 2 {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::CREATED
                };
                Ok::<_, BoxError>(response)
            }
        });
        let client = ClientLayer::new()
            .backoff(Duration::from_millis(1), Duration::from_millis(1))
            .metrics_label("payments-client")
            .layer(server.clone());
        assert_eq!(
            client.oneshot(payment("k", "{}")).await.unwrap().status(),
            201
        );
        // A budget with no retries: the first 503 is the answer.
        let broke = ClientLayer::new()
            .budget(TpsBudget::new(Duration::from_secs(1), 0, 0.0))
            .metrics_label("broke")
            .layer(service_fn(|_: Request<Full<Bytes>>| async {
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, BoxError>(response)
            }));
        assert_eq!(
            broke.oneshot(payment("k", "{}")).await.unwrap().status(),
            503
        );
        let scrape = scrape.render();
        let attempts = |layer: &str, attempt: &str| {
            value(
                &scrape,
                CLIENT_ATTEMPTS,
                &[("layer", layer), ("attempt", attempt)],
            )
        };
        assert_eq!(attempts("payments-client", "first"), Some(1.0), "{scrape}");
        assert_eq!(attempts("payments-client", "retry"), Some(2.0), "{scrape}");
        assert_eq!(attempts("broke", "first"), Some(1.0), "{scrape}");
        assert_eq!(attempts("broke", "retry"), None, "{scrape}");
        let refused = |layer: &str| value(&scrape, CLIENT_BUDGET_REFUSALS, &[("layer", layer)]);
        assert_eq!(refused("broke"), Some(1.0), "{scrape}");
        assert_eq!(refused("payments-client"), None, "{scrape}");
    }
}
