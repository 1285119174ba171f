//! Scopes and endpoints: one `request_id` in two scopes, or on two endpoints, is two
//! operations.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tower::Layer;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::reply::Outcome;
use tower_idempotency::scope::store_key;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

#[derive(Clone)]
struct Tenant(&'static str);

fn as_tenant(tenant: &'static str, mut request: http::Request<Chunks>) -> http::Request<Chunks> {
    request.extensions_mut().insert(Tenant(tenant));
    request
}

fn scoped(
    store: MemoryStore,
    creates: Arc<AtomicUsize>,
) -> tower_idempotency::layer::Idempotency<
    Inner,
    MemoryStore,
    tower_idempotency::operation::LabelContract,
> {
    let inner = counting_service(store.clone(), creates, Duration::ZERO).into_inner();
    IdempotencyLayer::new(store, LabelContract)
        .scope(|parts: &http::request::Parts| {
            parts.extensions.get::<Tenant>().map(|t| t.0.to_owned())
        })
        .layer(inner)
}

#[tokio::test]
async fn the_same_request_id_in_two_scopes_is_two_operations() {
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = scoped(store.clone(), Arc::clone(&creates));

    send_to(&service, as_tenant("acme", valid()))
        .await
        .is_created();
    // Another tenant, same key, another parcel: no conflict, no replay, its own create.
    let other = send_to(&service, as_tenant("globex", operation(KEY, "parcel-43"))).await;
    assert_eq!(
        (other.status.as_u16(), other.outcome),
        (201, Some(Outcome::Created))
    );
    assert_eq!(creates.load(Ordering::SeqCst), 2);
    // Each replays its own.
    let replay = send_to(&service, as_tenant("acme", valid())).await;
    assert_eq!(replay.outcome, Some(Outcome::Replay));
    send_to(&service, as_tenant("acme", operation(KEY, "parcel-43")))
        .await
        .exact(409, r#"{"error":"idempotency_conflict"}"#);
    assert!(
        store
            .completed(&store_key(
                Some("acme"),
                &http::Method::POST,
                "/labels",
                KEY
            ))
            .is_some()
    );
    assert!(
        store
            .completed(&store_key(
                Some("globex"),
                &http::Method::POST,
                "/labels",
                KEY
            ))
            .is_some()
    );
    assert!(store.completed(&key_of(KEY)).is_none(), "no unscoped key");
}

#[tokio::test]
async fn a_pending_operation_in_one_scope_does_not_block_another() {
    let store = MemoryStore::new();
    let gate = Arc::new(tokio::sync::Notify::new());
    let (rig, creates) = rig_with_gated_create(Arc::clone(&gate));
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .scope(|parts: &http::request::Parts| {
            parts.extensions.get::<Tenant>().map(|t| t.0.to_owned())
        })
        .layer(rig.service.get_ref().clone());
    let mut held = service.clone();
    let first = tokio::spawn(call(&mut held, as_tenant("acme", valid())).await);
    wait_for(|| {
        store.is_pending(&store_key(
            Some("acme"),
            &http::Method::POST,
            "/labels",
            KEY,
        ))
    })
    .await;
    // While acme's operation is pending, globex's with the same key is new and creates.
    let mut second = service.clone();
    let other = tokio::spawn(call(&mut second, as_tenant("globex", valid())).await);
    wait_for(|| creates.load(Ordering::SeqCst) == 2).await;
    assert!(store.is_pending(&store_key(
        Some("acme"),
        &http::Method::POST,
        "/labels",
        KEY
    )));
    while !(first.is_finished() && other.is_finished()) {
        gate.notify_one();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for task in [first, other] {
        Reply::read(task.await.unwrap().unwrap()).await.is_created();
    }
    assert_eq!(creates.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_request_without_a_required_scope_is_refused_before_the_store() {
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let service = scoped(store.clone(), Arc::clone(&creates));
    let reply = send_to(&service, valid()).await;
    reply.exact(403, r#"{"error":"scope_required"}"#);
    assert_eq!(
        reply.outcome,
        Some(Outcome::Rejected(http::StatusCode::FORBIDDEN))
    );
    assert!(store.is_empty());
    assert_eq!(creates.load(Ordering::SeqCst), 0);
    // The contract's own refusals still come first.
    send_to(&service, request("GET", "/labels", None, None, ""))
        .await
        .exact(405, r#"{"error":"method_not_allowed"}"#);
}

#[tokio::test]
async fn two_endpoints_on_one_store_have_separate_keys() {
    let store = MemoryStore::new();
    let creates = Arc::new(AtomicUsize::new(0));
    let inner = counting_service(store.clone(), Arc::clone(&creates), Duration::ZERO).into_inner();
    let labels = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .path("/labels")
        .layer(inner.clone());
    let returns = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .path("/returns")
        .layer(inner);
    send_to(&labels, valid()).await.is_created();
    let on_returns = request(
        "POST",
        "/returns",
        Some(KEY),
        Some("application/json"),
        BODY,
    );
    let reply = send_to(&returns, on_returns).await;
    assert_eq!(
        reply.outcome,
        Some(Outcome::Created),
        "not a replay of /labels"
    );
    assert_eq!(creates.load(Ordering::SeqCst), 2);
    assert_eq!(store.len(), 2);
}
