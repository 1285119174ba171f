//! Tracing, the outcome extension, and the opt-in replay marker.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::{IdempotencyLayer, Outcome};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Every span field and event field recorded, as `name=value` lines.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<String>>>);

struct Lines<'a>(&'a mut Vec<String>);

impl Visit for Lines<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={:?}", field.name(), value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push(format!("{}={value}", field.name()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        attrs.record(&mut Lines(&mut self.0.lock().unwrap()));
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        values.record(&mut Lines(&mut self.0.lock().unwrap()));
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        event.record(&mut Lines(&mut self.0.lock().unwrap()));
    }
}

impl Recorded {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

async fn traced(
    configure: impl FnOnce(
        IdempotencyLayer<RecordingStore, ScriptedAdmission>,
    ) -> IdempotencyLayer<RecordingStore, ScriptedAdmission>,
) -> (Rig, Recorded, tracing::subscriber::DefaultGuard) {
    let recorded = Recorded::default();
    let subscriber = tracing_subscriber::registry().with(recorded.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    (Rig::with_layer(configure), recorded, guard)
}

#[tokio::test]
async fn every_request_has_a_span_with_its_outcome_and_fingerprint_never_its_body() {
    let (rig, recorded, _guard) = traced(|layer| layer).await;
    rig.send(valid()).await.is_created();
    let lines = recorded.take();
    let fingerprint = format!(
        "fingerprint={}",
        tower_idempotency::fingerprint(KEY, "parcel-42")
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
    let (rig, recorded, _guard) = traced(|layer| layer.trace_keys(true)).await;
    rig.send(valid()).await;
    let key = format!("key={}", key_of(KEY));
    assert!(recorded.take().contains(&key));
}

#[tokio::test]
async fn an_outer_layer_can_count_outcomes_from_the_response_extension() {
    let counted: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let seen = Arc::clone(&counted);
    let rig = Rig::new();
    let service = ServiceBuilder::new()
        .map_response(move |response: http::Response<_>| {
            if let Some(outcome) = response.extensions().get::<Outcome>() {
                seen.lock().unwrap().push(*outcome);
            }
            response
        })
        .service(rig.service.clone());
    for request in [
        valid(),
        valid(),
        operation(KEY, "x"),
        request("PUT", "/labels", None, None, ""),
    ] {
        Reply::read(service.clone().oneshot(request).await.unwrap()).await;
    }
    assert_eq!(
        *counted.lock().unwrap(),
        [
            Outcome::Created,
            Outcome::Replay,
            Outcome::Conflict,
            Outcome::Rejected(http::StatusCode::METHOD_NOT_ALLOWED)
        ]
    );
}

#[tokio::test]
async fn the_replay_marker_is_off_by_default_and_marks_replays_only() {
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
