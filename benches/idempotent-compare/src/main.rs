//! The layer against crates.io's `idempotent` 2.x, in one run, on one machine.
//!
//! Every contender wraps the same create service (the label contract's 201, the benches' `Create`),
//! driven through `ServiceExt` (`ready`, `call`, the response body read to its end). The
//! requests are the same for every contender (`Idempotency-Key: k-<n>`, body
//! `{"request_id":"k-<n>","parcel_id":"p-<n>"}`), built before the timed region. Contenders
//! are interleaved round by round and the medians of the rounds are reported, with each
//! contender's ratio to the bare service measured in the same rounds. Beside the two crates,
//! this layer on a store with a one-second retention window (as a server keeps its retry
//! window), and on a store that keeps nothing: the floor of the layer's own cost, whatever the
//! store.
//!
//! `cargo run --release --ignore-rust-version --manifest-path benches/idempotent-compare/Cargo.toml [rounds] [requests]`

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};

#[path = "../../common/mod.rs"]
mod common;
use common::{Create, KeepsNothing};
use tower_idempotency::operation::LabelContract;

/// Attempt `n` of the shared workload.
fn request(n: usize) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"request_id":"k-{n}","parcel_id":"p-{n}"}}"#);
    Request::post("/labels")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", format!("k-{n}"))
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request")
}

/// Sends every request through `service` in turn, each read to its end; the time per request.
async fn drive<S, B>(service: &mut S, requests: Vec<Request<Full<Bytes>>>) -> Duration
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let n = requests.len() as u32;
    let started = Instant::now();
    for request in requests {
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("a response");
        assert!(response.status().is_success(), "{}", response.status());
        std::hint::black_box(response.into_body().collect().await.expect("a body"));
    }
    started.elapsed() / n
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

type Contender = (&'static str, fn() -> Bench);

/// One contender's service, type-erased to a closure that drives a batch.
type Bench =
    Box<dyn FnMut(Vec<Request<Full<Bytes>>>) -> std::pin::Pin<Box<dyn Future<Output = Duration>>>>;

fn bench<S, B>(service: S) -> Bench
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + 'static,
    S::Error: std::fmt::Debug,
    S::Future: 'static,
    B: http_body::Body + 'static,
    B::Error: std::fmt::Debug,
{
    Box::new(move |requests| {
        let mut service = service.clone();
        Box::pin(async move { drive(&mut service, requests).await })
    })
}

fn ours() -> Bench {
    let layer = tower_idempotency::IdempotencyLayer::new(
        tower_idempotency::MemoryStore::builder().keep_forever().build(),
        LabelContract,
    )
    .global_keys();
    bench(layer.layer(Create))
}

/// The layer on a memory store that keeps completed records for one second, as a server keeps
/// them for its retry window (the load run's `retained` server).
fn ours_retained() -> Bench {
    let store = tower_idempotency::MemoryStore::with_retention(Duration::from_secs(1));
    let layer = tower_idempotency::IdempotencyLayer::new(store, LabelContract).global_keys();
    bench(layer.layer(Create))
}

/// The layer on a store that keeps nothing: every claim new, every complete accepted. Not a
/// store anyone should run, but the floor of what the layer costs with any store: its own
/// steps (the body read, the parse, the fingerprint, the key, the decision, the response read
/// and handed back), with the store's work taken out.
fn ours_floor() -> Bench {
    let layer = tower_idempotency::IdempotencyLayer::new(KeepsNothing, LabelContract).global_keys();
    bench(layer.layer(Create))
}

/// The plain reference layer (`benches/common/reference.rs`): the least correct work.
fn reference() -> Bench {
    bench(common::reference::ReferenceLayer::default().layer(Create))
}

fn theirs() -> Bench {
    let store = idempotent::memory::MemoryStore::builder()
        .try_build()
        .expect("idempotent's memory store");
    bench(idempotent::middleware::IdempotencyLayer::new(store).layer(Create))
}

fn bare() -> Bench {
    bench(tower::service_fn(|request: Request<Full<Bytes>>| {
        let mut create = Create;
        create.call(request)
    }))
}

/// Per-request times of every contender on the new path (a fresh key each request) and the
/// replay path (one key, created before the timed region), interleaved round by round.
fn latency(rounds: usize, per_round: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let contenders: Vec<Contender> = vec![
        ("bare service", bare),
        ("tower-idempotency", ours),
        ("idempotent 2.0", theirs),
        ("tower-idempotency, 1 s retention", ours_retained),
        (
            "tower-idempotency on a store that keeps nothing (floor)",
            ours_floor,
        ),
        ("plain reference layer", reference),
    ];
    // Within the runtime: a store may start a task of its own.
    let _entered = runtime.enter();
    let mut services: Vec<Bench> = contenders.iter().map(|(_, make)| make()).collect();
    let mut new: Vec<Vec<f64>> = vec![Vec::new(); services.len()];
    let mut replay: Vec<Vec<f64>> = vec![Vec::new(); services.len()];
    let next = AtomicUsize::new(0);
    runtime.block_on(async {
        // The replayed key, created once per contender.
        for service in &mut services {
            service(vec![request(usize::MAX)]).await;
        }
        for _ in 0..rounds {
            for (i, service) in services.iter_mut().enumerate() {
                let first = next.fetch_add(per_round, Ordering::Relaxed);
                let batch = (first..first + per_round).map(request).collect();
                new[i].push(service(batch).await.as_nanos() as f64);
                let batch = (0..per_round).map(|_| request(usize::MAX)).collect();
                replay[i].push(service(batch).await.as_nanos() as f64);
            }
        }
    });
    let new: Vec<f64> = new.into_iter().map(median).collect();
    let replay: Vec<f64> = replay.into_iter().map(median).collect();
    println!("| contender | new (ns) | × bare | replay (ns) | × bare |");
    println!("|---|---|---|---|---|");
    for (i, (name, _)) in contenders.iter().enumerate() {
        // A store that keeps nothing replays nothing: its repeated key is new each time.
        let replay = if name.contains("keeps nothing") {
            "— | —".to_owned()
        } else {
            format!("{:.0} | {:.2}", replay[i], replay[i] / replay[0])
        };
        println!(
            "| {name} | {:.0} | {:.2} | {replay} |",
            new[i],
            new[i] / new[0]
        );
    }
    println!(
        "\nidempotent 2.0 ÷ tower-idempotency: new {:.2}×, replay {:.2}×",
        new[2] / new[1],
        replay[2] / replay[1]
    );
    println!(
        "tower-idempotency ÷ the plain reference layer: new {:.2}×, replay {:.2}×",
        new[1] / new[5],
        replay[1] / replay[5]
    );
}

/// The time `tasks` concurrent tasks take to send their batches through clones of `service`.
fn concurrently<S, B>(
    runtime: &tokio::runtime::Runtime,
    service: &S,
    batches: Vec<Vec<Request<Full<Bytes>>>>,
) -> Duration
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: std::fmt::Debug,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    runtime.block_on(async {
        let started = Instant::now();
        let handles: Vec<_> = batches
            .into_iter()
            .map(|batch| {
                let mut service = service.clone();
                tokio::spawn(async move { drive(&mut service, batch).await })
            })
            .collect();
        for handle in handles {
            handle.await.expect("a task");
        }
        started.elapsed()
    })
}

/// Requests a second of every contender with 64 tasks on a two-worker runtime, every
/// request new; medians of the rounds, contenders interleaved.
fn throughput(rounds: usize, per_task: usize) {
    let tasks = 64;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let bare = tower::service_fn(|request: Request<Full<Bytes>>| {
        let mut create = Create;
        create.call(request)
    });
    let ours = tower_idempotency::IdempotencyLayer::new(
        tower_idempotency::MemoryStore::builder().keep_forever().build(),
        LabelContract,
    )
    .global_keys()
    .layer(Create);
    let theirs = runtime.block_on(async {
        let store = idempotent::memory::MemoryStore::builder()
            .try_build()
            .expect("idempotent's memory store");
        idempotent::middleware::IdempotencyLayer::new(store).layer(Create)
    });
    let reference = common::reference::ReferenceLayer::default().layer(Create);
    let next = AtomicUsize::new(1 << 40);
    let batches = || -> Vec<Vec<Request<Full<Bytes>>>> {
        (0..tasks)
            .map(|_| {
                let first = next.fetch_add(per_task, Ordering::Relaxed);
                (first..first + per_task).map(request).collect()
            })
            .collect()
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); 4];
    let rate = |elapsed: Duration| (tasks * per_task) as f64 / elapsed.as_secs_f64();
    for _ in 0..rounds {
        rates[0].push(rate(concurrently(&runtime, &bare, batches())));
        rates[1].push(rate(concurrently(&runtime, &ours, batches())));
        rates[2].push(rate(concurrently(&runtime, &theirs, batches())));
        rates[3].push(rate(concurrently(&runtime, &reference, batches())));
    }
    println!("\n| contender | requests/s, 64 tasks on 2 workers, every request new | × bare |");
    println!("|---|---|---|");
    let rates: Vec<f64> = rates.into_iter().map(median).collect();
    for (i, name) in [
        "bare service",
        "tower-idempotency",
        "idempotent 2.0",
        "plain reference layer",
    ]
    .iter()
    .enumerate()
    {
        println!("| {name} | {:.0} | {:.2} |", rates[i], rates[i] / rates[0]);
    }
    println!(
        "\ntower-idempotency ÷ idempotent 2.0 throughput: {:.2}×",
        rates[1] / rates[2]
    );
    println!(
        "tower-idempotency ÷ the plain reference layer throughput: {:.2}×",
        rates[1] / rates[3]
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds = args.next().and_then(|a| a.parse().ok()).unwrap_or(9);
    let per_round = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    latency(rounds, per_round);
    throughput(rounds.min(5), per_round / 20);
}
