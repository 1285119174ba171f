//! `pending_wait`: what the setting costs on the new path when nobody waits (the memory store,
//! with and without it, in the same run), and how soon after a first attempt completes a
//! request waiting for it has its reply, on each store. The baseline of each latency is a
//! replay on the same store, measured in the same run: a woken waiter claims once more, so
//! about one replay plus the wake-up is the floor.
//!
//! `cargo bench --all-features --bench pending_wait`; needs Redis at `REDIS_URL` and
//! PostgreSQL at `DATABASE_URL`.

mod common;

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Create, valid};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::Store;
use tower_idempotency::store::{MemoryStore, PostgresStore, RedisStore};

static RUN: AtomicU64 = AtomicU64::new(0);

/// A key no earlier run used.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{nanos}-{}", RUN.fetch_add(1, Ordering::Relaxed))
}

/// The new path on the memory store without the setting and with it, nobody waiting.
fn nobody_waits(c: &mut Criterion, runtime: &tokio::runtime::Runtime) {
    let off = IdempotencyLayer::new(MemoryStore::builder().keep_forever().build(), LabelContract)
        .global_keys()
        .layer(Create);
    let on = IdempotencyLayer::new(MemoryStore::builder().keep_forever().build(), LabelContract)
        .global_keys()
        .pending_wait(Duration::from_secs(5))
        .layer(Create);
    let mut group = c.benchmark_group("nobody waits (memory, new)");
    for (name, service) in [("pending_wait off", off), ("pending_wait on", on)] {
        group.bench_function(name, |b| {
            b.to_async(runtime).iter_batched(
                || valid(&unique("n")),
                |request| async {
                    let response = service.clone().oneshot(request).await.unwrap();
                    black_box(response.into_body().collect().await.unwrap().to_bytes())
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

/// The label contract's create, held until the bench opens the gate.
#[derive(Clone, Default)]
struct Gated {
    gate: Arc<Notify>,
    entered: Arc<AtomicUsize>,
}

impl Service<Request<RequestBody<Full<Bytes>>>> for Gated {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody<Full<Bytes>>>) -> Self::Future {
        let gated = self.clone();
        Box::pin(async move {
            let gate = gated.gate.notified();
            gated.entered.fetch_add(1, Ordering::SeqCst);
            gate.await;
            Create.call(request).await
        })
    }
}

/// One round: a first attempt held in its create, a retry waiting for it, the gate opened;
/// returns the time from the opening to the first attempt's reply and to the waiter's.
async fn round<St: Store + Clone>(
    store: &St,
    gated: &Gated,
    waited: &(impl Fn(&St) -> usize + Sync),
) -> (Duration, Duration) {
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .pending_wait(Duration::from_secs(5))
        .layer(gated.clone());
    let key = unique("w");
    let entered = gated.entered.load(Ordering::SeqCst);
    let first = tokio::spawn(service.clone().oneshot(valid(&key)));
    while gated.entered.load(Ordering::SeqCst) == entered {
        tokio::task::yield_now().await;
    }
    let waiter = {
        let service = service.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let response = service.oneshot(valid(&key)).await.unwrap();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (Instant::now(), body)
        })
    };
    while waited(store) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Past the waiter's registration and, on PostgreSQL, its mark: the completion's own
    // announcement wakes it, not the mark finding the key done.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let opened = Instant::now();
    gated.gate.notify_one();
    let first = first.await.unwrap().unwrap();
    let first_body = first.into_body().collect().await.unwrap().to_bytes();
    let answered = opened.elapsed();
    let (woken, body) = waiter.await.unwrap();
    assert_eq!(body, first_body, "the waiter replays the first attempt");
    (answered, woken.saturating_duration_since(opened))
}

/// On `store`: from the create's end to the first attempt's reply (its complete and the
/// reply) and to the waiting retry's reply (the complete, the wake-up and a replay), next to
/// a replay on the store. The waiter's latency past the completion is the difference of the
/// first two, about a replay when the wake-up itself costs nothing.
fn store_latency<St: Store + Clone>(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    store: St,
    waited: impl Fn(&St) -> usize + Sync,
) {
    let mut group = c.benchmark_group(name);
    let service = IdempotencyLayer::new(store.clone(), LabelContract)
        .global_keys()
        .layer(Create);
    common::replays(
        &mut group,
        runtime,
        "replay (baseline)",
        &service,
        &unique("r"),
    );
    let gated = Gated::default();
    for (name, waiter) in [
        ("create's end to first reply", false),
        ("create's end to waiter's reply", true),
    ] {
        group.bench_function(name, |b| {
            b.to_async(runtime).iter_custom(|iterations| {
                let (store, gated, waited) = (&store, &gated, &waited);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        let (first, woken) = round(store, gated, waited).await;
                        total += if waiter { woken } else { first };
                    }
                    total
                }
            });
        });
    }
    group.finish();
}

fn pending_wait(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    nobody_waits(c, &runtime);
    store_latency(
        c,
        &runtime,
        "memory",
        MemoryStore::builder().keep_forever().build(),
        MemoryStore::waited_keys,
    );

    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let redis = runtime
        .block_on(RedisStore::connect(&redis_url))
        .expect("Redis at REDIS_URL")
        .prefix("tower-idempotency-bench:")
        .retention(Duration::from_secs(60));
    store_latency(c, &runtime, "redis", redis, RedisStore::waited_keys);

    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let postgres = runtime
        .block_on(PostgresStore::connect(&database_url))
        .expect("PostgreSQL at DATABASE_URL")
        .table("tower_idempotency_bench_wait")
        .unwrap();
    runtime.block_on(postgres.migrate()).unwrap();
    store_latency(
        c,
        &runtime,
        "postgres",
        postgres.clone(),
        PostgresStore::waited_keys,
    );
    runtime.block_on(async {
        tower_idempotency::store::postgres::sqlx::raw_sql(
            "DROP TABLE tower_idempotency_bench_wait",
        )
        .execute(postgres.pool())
        .await
        .unwrap();
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = pending_wait
}
criterion_main!(benches);
