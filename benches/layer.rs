//! The layer against the bare service, in process, per request.
//!
//! `cargo bench --bench layer`. Compare each path with `bare` from the same run: the
//! differences are the layer's cost.

mod common;
#[path = "../examples/grpc_labels/mod.rs"]
mod grpc_labels;

use common::{Create, request, valid};
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::layer::Idempotency;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::Claim;
use tower_idempotency::store::Store;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

const BODY: &str = r#"{"request_id":"label-req-7","parcel_id":"parcel-42"}"#;

async fn drive<S, B>(service: &S, request: Request<B>) -> Bytes
where
    S: Service<
            Request<B>,
            Response = Response<tower_idempotency::layer::ResponseBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone,
{
    let response = service.clone().oneshot(request).await.unwrap();
    response.into_body().collect().await.unwrap().to_bytes()
}

fn layer_paths(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("layer");

    group.bench_function("bare", |b| {
        b.to_async(&runtime).iter_batched(
            || valid("label-req-7").map(RequestBody::<Full<Bytes>>::inner),
            |request| async {
                let response = Create.oneshot(request).await.unwrap();
                black_box(response.into_body().collect().await.unwrap().to_bytes())
            },
            BatchSize::SmallInput,
        );
    });

    // A one-second retention keeps the store at a steady size, as in a long-running process;
    // without it the store grows by every measured request and its growth dominates.
    let store = MemoryStore::with_retention(Duration::from_secs(1));
    let service: Idempotency<Create, MemoryStore, LabelContract> =
        IdempotencyLayer::new(store, LabelContract)
            .global_keys()
            .layer(Create);
    let next = AtomicU64::new(0);
    group.bench_function("new", |b| {
        b.to_async(&runtime).iter_batched(
            || valid(&format!("k{}", next.fetch_add(1, Ordering::Relaxed))),
            |request| async { black_box(drive(&service, request).await) },
            BatchSize::SmallInput,
        );
    });

    runtime.block_on(drive(&service, valid("label-req-7")));
    group.bench_function("replay", |b| {
        b.to_async(&runtime).iter_batched(
            || valid("label-req-7"),
            |request| async { black_box(drive(&service, request).await) },
            BatchSize::SmallInput,
        );
    });

    type MakeRequest = fn() -> Request<Full<Bytes>>;
    let refusals: [(&str, MakeRequest); 3] = [
        ("refuse_415", || {
            request(
                "label-req-7",
                "text/plain",
                Bytes::from_static(BODY.as_bytes()),
            )
        }),
        ("refuse_413", || {
            let mut request = valid("label-req-7");
            request
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from_static("5000"));
            request
        }),
        ("refuse_400", || {
            request(
                "label-req-7",
                "application/json",
                Bytes::from_static(b"{\"request_id\":1}"),
            )
        }),
    ];
    for (name, make) in refusals {
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter_batched(
                make,
                |request| async { black_box(drive(&service, request).await) },
                BatchSize::SmallInput,
            );
        });
    }

    // The generic JSON operation: a typed, validated body, fingerprinted in canonical JSON.
    let json = common::json_service(MemoryStore::with_retention(Duration::from_secs(1)));
    group.bench_function("json_new", |b| {
        b.to_async(&runtime).iter_batched(
            || common::payment(&format!("k{}", next.fetch_add(1, Ordering::Relaxed))),
            |request| async { black_box(drive(&json, request).await) },
            BatchSize::SmallInput,
        );
    });
    runtime.block_on(drive(&json, common::payment("pay-1")));
    group.bench_function("json_replay", |b| {
        b.to_async(&runtime).iter_batched(
            || common::payment("pay-1"),
            |request| async { black_box(drive(&json, request).await) },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

/// A unary gRPC call through the example's `labels.v1.Labels` service, bare and guarded by
/// `GrpcOperation` (memory store), in process: the framed request built outside the timed
/// region, the response read to its end, trailers included.
fn grpc(c: &mut Criterion) {
    use http_body::Body;
    use prost::Message;
    use tower::Layer;
    use tower_idempotency::IdempotencyLayer;

    async fn call<S, B>(service: &S, request: Request<Full<Bytes>>) -> Bytes
    where
        S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible> + Clone,
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Debug,
    {
        let response = service.clone().oneshot(request).await.unwrap();
        let collected = response.into_body().collect().await.unwrap();
        assert!(
            collected.trailers().is_some(),
            "a gRPC answer ends with its status"
        );
        collected.to_bytes()
    }

    fn create_label(key: &str) -> Request<Full<Bytes>> {
        let message = grpc_labels::CreateLabelRequest {
            request_id: key.to_owned(),
            parcel_id: "parcel-42".to_owned(),
        }
        .encode_to_vec();
        Request::post(grpc_labels::CREATE_LABEL)
            .header(header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .header("idempotency-key", key)
            .body(Full::new(grpc_labels::web::frame(&message).into()))
            .expect("a valid request")
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("grpc");
    let bare = grpc_labels::Labels::new(Duration::ZERO);
    let guarded = IdempotencyLayer::new(
        MemoryStore::with_retention(Duration::from_secs(1)),
        grpc_labels::operation(),
    )
    .global_keys()
    .layer(grpc_labels::Labels::new(Duration::ZERO));
    let next = AtomicU64::new(0);
    group.bench_function("bare", |b| {
        b.to_async(&runtime).iter_batched(
            || create_label(&format!("g{}", next.fetch_add(1, Ordering::Relaxed))),
            |request| async { black_box(call(&bare, request).await) },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("new", |b| {
        b.to_async(&runtime).iter_batched(
            || create_label(&format!("g{}", next.fetch_add(1, Ordering::Relaxed))),
            |request| async { black_box(call(&guarded, request).await) },
            BatchSize::SmallInput,
        );
    });
    // Replays from a store that keeps its one record for good: every call a replay.
    let replaying = IdempotencyLayer::new(
        MemoryStore::builder().keep_forever().build(),
        grpc_labels::operation(),
    )
    .global_keys()
    .layer(grpc_labels::Labels::new(Duration::ZERO));
    runtime.block_on(call(&replaying, create_label("g-replay")));
    group.bench_function("replay", |b| {
        b.to_async(&runtime).iter_batched(
            || create_label("g-replay"),
            |request| async { black_box(call(&replaying, request).await) },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

/// What the canonical form (RFC 8785) costs next to parsing the same body with serde_json.
fn canonical_json(c: &mut Criterion) {
    let mut group = c.benchmark_group("canonical_json");
    let body = common::PAYMENT.as_bytes();
    group.bench_function("serde_json_value", |b| {
        b.iter(|| black_box(serde_json::from_slice::<serde_json::Value>(black_box(body)).unwrap()));
    });
    group.bench_function("serde_json_typed", |b| {
        b.iter(|| {
            black_box(serde_json::from_slice::<common::NewPayment>(black_box(body)).unwrap())
        });
    });
    group.bench_function("canonical", |b| {
        b.iter(|| {
            black_box(tower_idempotency::operation::canonical_json(black_box(body)).unwrap())
        });
    });
    group.finish();
}

/// Claims per second of the memory store with 1, 2 and 8 tasks on a multi-threaded runtime,
/// on distinct keys and on one hot key.
fn memory_contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_store");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let fp = LabelContract::fingerprint("label-req-7", "parcel-42");
    for tasks in [1usize, 2, 8] {
        for hot in [false, true] {
            let name = format!(
                "{}_{tasks}_tasks",
                if hot { "hot_key" } else { "distinct_keys" }
            );
            group.bench_function(name, |b| {
                b.iter_custom(|iterations| {
                    let store = MemoryStore::new();
                    let keys: Arc<Vec<String>> =
                        Arc::new((0..iterations).map(|i| format!("/labels:k{i}")).collect());
                    runtime.block_on(async {
                        let started = Instant::now();
                        let per_task = iterations.div_ceil(tasks as u64) as usize;
                        let handles: Vec<_> = (0..tasks)
                            .map(|t| {
                                let (store, keys) = (store.clone(), Arc::clone(&keys));
                                tokio::spawn(async move {
                                    for i in t * per_task..((t + 1) * per_task).min(keys.len()) {
                                        let key =
                                            if hot { "/labels:hot" } else { keys[i].as_str() };
                                        let claim = store.claim(key, &fp).await.unwrap();
                                        black_box(matches!(claim, Claim::New(_)));
                                    }
                                })
                            })
                            .collect();
                        for handle in handles {
                            handle.await.unwrap();
                        }
                        started.elapsed()
                    })
                });
            });
        }
    }
    group.finish();
}

/// The function API beside calling its work bare: the work builds a small label (a format and
/// an allocation, as a real one would at least), its fingerprint computed per message as a
/// consumer computes it; `new` runs under a fresh key, `replay` under a completed one.
fn idempotent_run(c: &mut Criterion) {
    use tower_idempotency::idempotent::{self, Idempotent};

    #[derive(serde::Serialize)]
    struct Message<'a> {
        id: &'a str,
        parcel_id: &'a str,
    }
    async fn work(parcel_id: &str) -> Result<String, ()> {
        Ok(format!("label for {parcel_id}"))
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("idempotent");
    group.bench_function("bare", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(work(black_box("parcel-42")).await) });
    });
    let store = MemoryStore::with_retention(Duration::from_secs(1));
    let labels = Idempotent::new(store).scope("labels");
    let next = AtomicU64::new(0);
    group.bench_function("new", |b| {
        b.to_async(&runtime).iter_batched(
            || format!("msg-{}", next.fetch_add(1, Ordering::Relaxed)),
            |id| {
                let labels = &labels;
                async move {
                    let message = Message {
                        id: &id,
                        parcel_id: "parcel-42",
                    };
                    let fingerprint = idempotent::fingerprint(&message).unwrap();
                    black_box(
                        labels
                            .run(&id, fingerprint, |_| work(message.parcel_id))
                            .await,
                    )
                }
            },
            BatchSize::SmallInput,
        );
    });
    let message = Message {
        id: "msg-replayed",
        parcel_id: "parcel-42",
    };
    let fingerprint = idempotent::fingerprint(&message).unwrap();
    runtime
        .block_on(labels.run(message.id, fingerprint, |_| work(message.parcel_id)))
        .unwrap();
    group.bench_function("replay", |b| {
        b.to_async(&runtime).iter(|| async {
            let fingerprint = idempotent::fingerprint(&message).unwrap();
            black_box(
                labels
                    .run(message.id, fingerprint, |_| work(message.parcel_id))
                    .await,
            )
        });
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = layer_paths, canonical_json, memory_contention, grpc, idempotent_run
}
criterion_main!(benches);
