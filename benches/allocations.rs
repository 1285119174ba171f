//! Heap allocations per request on each path, counted by a global allocator; the memory a
//! completed key holds in the memory store; and, under callgrind, instructions per request.
//!
//! `cargo bench --bench allocations` prints allocations, and the bytes per key of 100,000
//! completed keys. `allocations memory <n>` measures `n` keys instead. `allocations <path> <n>`
//! sends `n` requests of one path only (`bare`, `new`, `replay`, `refuse_415`, `refuse_413`,
//! `refuse_400`, `json_new`, `json_replay`; `floor`, the new path on a store that keeps
//! nothing; `axum_bare` and `axum_new` through an axum router), for
//! `benches/instructions.sh` to count under callgrind. Counts, not times: the same on every
//! machine for the same binary.

mod common;

use common::{Create, request, valid};
use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt};
use tower_idempotency::MemoryStore;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Bytes allocated and not yet freed, as asked for (the allocator's own rounding excluded).
static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter has no effect
// on the memory handed out.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations of one request through `service`, the request's own construction excluded.
fn count<S>(runtime: &tokio::runtime::Runtime, service: &S, request: Request<Full<Bytes>>) -> usize
where
    S: Service<Request<Full<Bytes>>, Error = Infallible> + Clone,
    S::Response: Into<Response<tower_idempotency::layer::ResponseBody<Full<Bytes>>>>,
{
    runtime.block_on(async {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let response: Response<_> = service.clone().oneshot(request).await.unwrap().into();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        std::hint::black_box(body);
        ALLOCATIONS.load(Ordering::Relaxed) - before
    })
}

/// Allocations of one request through an axum router, the request's own construction
/// excluded.
fn count_axum(
    runtime: &tokio::runtime::Runtime,
    router: &axum::Router,
    request: Request<Full<Bytes>>,
) -> usize {
    runtime.block_on(async {
        let request = request.map(axum::body::Body::new);
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let response = router.clone().oneshot(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        std::hint::black_box(body);
        ALLOCATIONS.load(Ordering::Relaxed) - before
    })
}

/// The new path through axum, bare and behind the layer on the route (as the README puts
/// it): what the layer adds where a router inserts extensions of its own before it, so that
/// the operation's value takes one allocation rather than a map's three.
fn axum_rows(runtime: &tokio::runtime::Runtime) {
    let [bare, layered] = routers();
    let median = |router: &axum::Router, tag: &str| {
        for i in 0..WARM {
            count_axum(runtime, router, valid(&format!("warm-{tag}-{i}")));
        }
        let mut counts: Vec<usize> = (0..9)
            .map(|i| count_axum(runtime, router, valid(&format!("{tag}-{i}"))))
            .collect();
        counts.sort_unstable();
        counts[counts.len() / 2]
    };
    let (bare, layered) = (median(&bare, "bare"), median(&layered, "layered"));
    println!(
        "{:>12}: {layered} (axum router; bare {bare}: the layer adds {})",
        "new",
        layered.saturating_sub(bare)
    );
}

/// An axum router of the label contract's create, bare and with the layer on its route.
fn routers() -> [axum::Router; 2] {
    async fn create() -> Response<Full<Bytes>> {
        common::created()
    }
    // `with_state(())`, as `axum::serve` does: each route is built once, not per request.
    let bare = axum::Router::new()
        .route("/labels", axum::routing::post(create))
        .with_state(());
    let layered = axum::Router::new()
        .route("/labels", axum::routing::post(create))
        .route_layer(
            tower_idempotency::IdempotencyLayer::new(
                MemoryStore::builder().keep_forever().build(),
                LabelContract,
            )
            .global_keys(),
        )
        .with_state(());
    [bare, layered]
}

/// One request of the named path.
fn path_request(path: &str, i: usize) -> Request<Full<Bytes>> {
    match path {
        "new" | "floor" | "reference" | "axum_new" | "axum_bare" => valid(&format!("k{i}")),
        "refuse_415" => request("k", "text/plain", "{}"),
        "refuse_413" => {
            let mut request = valid("k");
            request
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from_static("5000"));
            request
        }
        "refuse_400" => request("k", "application/json", "{\"request_id\":1}"),
        "json_new" => common::payment(&format!("k{i}")),
        "json_replay" => common::payment("pay-1"),
        _ => valid("label-req-7"),
    }
}

/// Keys completed before the new paths are counted: with a few per shard, one insert in
/// several grows a shard's table; with this many, about one in a hundred and fifty.
const WARM: usize = 10_000;

const PATHS: [&str; 8] = [
    "bare",
    "new",
    "replay",
    "refuse_415",
    "refuse_413",
    "refuse_400",
    "json_new",
    "json_replay",
];

/// The resident set of this process, in bytes (Linux), if it can be read.
fn resident() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The label contract's layer over `store`, around the bench's create.
fn labels(
    store: MemoryStore,
) -> tower_idempotency::layer::Idempotency<
    Create,
    MemoryStore,
    tower_idempotency::operation::LabelContract,
> {
    tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            store,
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        Create,
    )
}

/// The bytes each of `n` completed keys holds in a memory store, through the layer, beyond
/// the stored response's own bytes (status, header names and values, body).
fn memory_per_key(runtime: &tokio::runtime::Runtime, n: usize) {
    // Unbounded: `n` may be the default bound or more.
    let store = MemoryStore::builder().unbounded().build();
    let service = labels(store.clone());
    let keys: Vec<String> = (0..n).map(|i| format!("label-req-{i:08}")).collect();
    let sample = runtime.block_on(async {
        let response = Create
            .call(valid("sample").map(RequestBody::inner))
            .await
            .unwrap();
        let own: usize = response
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum();
        own + 2
            + response
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .len()
    });
    let (live, rss) = (LIVE.load(Ordering::Relaxed), resident());
    for key in &keys {
        count(runtime, &service, valid(key));
    }
    let held = LIVE.load(Ordering::Relaxed) - live;
    let rss = resident()
        .zip(rss)
        .map(|(after, before)| after.saturating_sub(before) / n);
    assert_eq!(store.len(), n);
    println!(
        "{n:>9} keys: {} bytes a key allocated ({} beyond the response's own {sample}), \
         {} bytes a key resident",
        held / n,
        (held / n).saturating_sub(sample),
        rss.map_or("?".to_owned(), |rss| rss.to_string()),
    );
    drop(keys);
}

/// The bytes each of `n` keys holds in a memory store once its replay window passed and it is
/// a tombstone, beside the bytes it held completed, in one run: the same keys through the
/// layer, then the store's purge, which turns every completed record into its tombstone.
fn memory_per_tombstone(runtime: &tokio::runtime::Runtime, n: usize) {
    let store = MemoryStore::builder()
        .unbounded()
        // Long enough that no claim of the run finds a record past it.
        .retention(std::time::Duration::from_secs(5))
        .tombstones(std::time::Duration::from_secs(24 * 3600))
        .build();
    let service = labels(store.clone());
    let keys: Vec<String> = (0..n).map(|i| format!("label-req-{i:08}")).collect();
    let live = LIVE.load(Ordering::Relaxed);
    for key in &keys {
        count(runtime, &service, valid(key));
    }
    let completed = LIVE.load(Ordering::Relaxed) - live;
    std::thread::sleep(std::time::Duration::from_secs(5));
    runtime.block_on(async {
        use tower_idempotency::store::Purge as _;
        store.purge_expired().await.unwrap();
    });
    let buried = LIVE.load(Ordering::Relaxed) - live;
    assert_eq!(store.len(), n);
    println!(
        "{n:>9} keys: {} bytes a key allocated completed, {} as a tombstone ({:.2}x)",
        completed / n,
        buried / n,
        buried as f64 / completed as f64,
    );
    drop(keys);
    // The creates' cost while every claim's sweep buries what passed a 1 ms window, against
    // the same store dropping it: rounds of each in turn, the median of each.
    let churn = |tombstones: std::time::Duration| {
        let store = MemoryStore::builder()
            .unbounded()
            .retention(std::time::Duration::from_millis(1))
            .tombstones(tombstones)
            .build();
        labels(store)
    };
    let (buried, dropped) = (
        churn(std::time::Duration::from_secs(3600)),
        churn(std::time::Duration::ZERO),
    );
    let round = |service: &_, round: usize| {
        let requests: Vec<_> = (0..n / 10)
            .map(|i| valid(&format!("churn-{round}-{i:08}")))
            .collect();
        let started = std::time::Instant::now();
        for request in requests {
            count(runtime, service, request);
        }
        started.elapsed().as_nanos() as f64 / (n / 10) as f64
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..7 {
        with.push(round(&buried, i));
        without.push(round(&dropped, i));
    }
    with.sort_by(f64::total_cmp);
    without.sort_by(f64::total_cmp);
    println!(
        "creates under churn (1 ms window): {:.0} ns each burying, {:.0} ns dropping ({:.2}x)",
        with[3],
        without[3],
        with[3] / without[3]
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let service = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            MemoryStore::builder().keep_forever().build(),
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        Create,
    );
    let json = common::json_service(MemoryStore::builder().keep_forever().build());
    // The layer's own steps, with the store's work taken out.
    let floor = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            common::KeepsNothing,
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        Create,
    );
    let bare = tower::service_fn(|request: Request<Full<Bytes>>| {
        let mut create = Create;
        let future = create.call(request.map(RequestBody::inner));
        async move {
            Ok::<_, Infallible>(
                future
                    .await?
                    .map(tower_idempotency::layer::ResponseBody::inner),
            )
        }
    });
    // The plain reference layer (`common/reference.rs`): the least correct work.
    let reference = tower::Layer::layer(&common::reference::ReferenceLayer::default(), Create);
    let reference = ServiceExt::<Request<Full<Bytes>>>::map_response(
        reference,
        |response: Response<Full<Bytes>>| {
            response.map(tower_idempotency::layer::ResponseBody::inner)
        },
    );
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if let [memory, n] = args.as_slice()
        && memory == "memory"
    {
        memory_per_key(&runtime, n.parse().expect("a count"));
        return;
    }
    if let [tombstones, n] = args.as_slice()
        && tombstones == "tombstones"
    {
        memory_per_tombstone(&runtime, n.parse().expect("a count"));
        return;
    }
    if let [path, n] = args.as_slice() {
        // Under callgrind: n requests of one path, the requests built beforehand.
        let n: usize = n.parse().expect("a count");
        count(&runtime, &service, valid("label-req-7"));
        count(&runtime, &json, common::payment("pay-1"));
        count(&runtime, &reference, valid("label-req-7"));
        let requests: Vec<_> = (0..n).map(|i| path_request(path, i)).collect();
        let [axum_bare, axum_layered] = routers();
        count_axum(&runtime, &axum_layered, valid("label-req-7"));
        for request in requests {
            if path == "axum_bare" {
                count_axum(&runtime, &axum_bare, request);
            } else if path == "axum_new" {
                count_axum(&runtime, &axum_layered, request);
            } else if path == "bare" {
                count(&runtime, &bare, request);
            } else if path == "floor" {
                count(&runtime, &floor, request);
            } else if path.starts_with("reference") {
                count(&runtime, &reference, request);
            } else if path.starts_with("json") {
                count(&runtime, &json, request);
            } else {
                count(&runtime, &service, request);
            }
        }
        return;
    }
    // Warm up: the first request of a process allocates thread-locals and the like; and the
    // store holds enough keys that its shards' tables seldom grow on the counted inserts.
    for i in 0..WARM {
        count(&runtime, &service, valid(&format!("warm-{i}")));
        count(&runtime, &json, common::payment(&format!("warm-{i}")));
    }
    for _ in 0..100 {
        count(&runtime, &bare, valid("warm"));
    }
    count(&runtime, &service, valid("label-req-7"));
    count(&runtime, &json, common::payment("pay-1"));
    println!("allocations per request (memory store, current-thread runtime; the median of 9)");
    for path in PATHS {
        // The median of several requests (new keys for the new paths): a store's table that
        // grows on one insert in a while allocates for that one.
        let mut counts: Vec<usize> = (0..9)
            .map(|i| {
                let request = path_request(path, usize::MAX - i);
                if path == "bare" {
                    count(&runtime, &bare, request)
                } else if path.starts_with("json") {
                    count(&runtime, &json, request)
                } else {
                    count(&runtime, &service, request)
                }
            })
            .collect();
        counts.sort_unstable();
        println!("{path:>12}: {}", counts[counts.len() / 2]);
    }
    // The layer with the operation's value left out of the request extensions.
    let lean = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            MemoryStore::builder().keep_forever().build(),
            LabelContract,
        )
        .global_keys()
        .value_extension(false),
        Create,
    );
    for i in 0..WARM {
        count(&runtime, &lean, valid(&format!("warm-{i}")));
    }
    let mut counts: Vec<usize> = (0..9)
        .map(|i| count(&runtime, &lean, path_request("new", usize::MAX - 100 - i)))
        .collect();
    counts.sort_unstable();
    println!(
        "{:>12}: {} (value_extension(false))",
        "new",
        counts[counts.len() / 2]
    );
    axum_rows(&runtime);
    println!("memory per completed key (memory store, no retention)");
    memory_per_key(&runtime, 100_000);
    println!("memory per key completed, then as a tombstone (memory store)");
    memory_per_tombstone(&runtime, 100_000);
}
