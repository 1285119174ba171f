//! Tracing, the outcome extension, and the opt-in replay marker.

mod common;

use std::cell::RefCell;
use std::sync::{Arc, Mutex, Once};

use common::*;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::LabelContract;
use tower_idempotency::scope::GlobalKeys;
use tower_idempotency::{IdempotencyLayer, Outcome};
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
        tower_idempotency::LabelContract::fingerprint(KEY, "parcel-42")
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
            move |response: http::Response<tower_idempotency::body::ResponseBody<_>>| {
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
