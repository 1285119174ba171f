//! The contract's test rig: a journal of calls, a recording store, admission and create, and
//! requests and assertions in the contract's words.
#![allow(dead_code, unreachable_pub)]

pub use tower_idempotency::testing::conformance;
pub mod labels;
pub mod payments;
pub mod servers;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt};
use tower_idempotency::body::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::{Fingerprint, LabelOperation};
use tower_idempotency::scope::GlobalKeys;
use tower_idempotency::store::{Claim, Lease, Reservation, StoreError, StoredResponse};
use tower_idempotency::{Idempotency, IdempotencyLayer, MemoryStore, Store};

pub use tower_idempotency::testing::{Journal, RecordingStore, ScriptedAdmission};

pub use self::labels::{BODY, CREATED_BODY, KEY, created_response};

/// The create's error. A concrete type, not a boxed `dyn Error`: a `'static` trait object in a
/// service type trips rustc's "higher-ranked lifetime error" (rust-lang/rust#102211) when the
/// service's future is held across an `.await` in a spawned task.
#[derive(Debug)]
pub struct CreateError(pub &'static str);

impl From<&'static str> for CreateError {
    fn from(message: &'static str) -> Self {
        Self(message)
    }
}

pub type Inner = tower::util::BoxCloneSyncService<
    Request<RequestBody<Chunks>>,
    Response<Full<Bytes>>,
    CreateError,
>;

/// The layer of the rig, its key space chosen.
pub type RigLayer = IdempotencyLayer<RecordingStore, LabelContract, ScriptedAdmission, GlobalKeys>;

/// The rig: a layer over a recording store and admission, wrapping a recording create.
pub struct Rig {
    pub journal: Journal,
    pub memory: MemoryStore,
    /// What admission answers; proceeds unless a test says otherwise.
    pub admission: ScriptedAdmission,
    pub creates: Arc<AtomicUsize>,
    /// The store, to fail its calls on demand.
    pub store: RecordingStore,
    pub service: Idempotency<Inner, RecordingStore, LabelContract, ScriptedAdmission>,
}

impl Rig {
    pub fn new() -> Self {
        Self::with_layer(|layer| layer)
    }

    /// A rig whose layer the caller may configure further.
    pub fn with_layer(
        configure: impl FnOnce(
            RigLayer,
        ) -> IdempotencyLayer<
            RecordingStore,
            LabelContract,
            ScriptedAdmission,
            GlobalKeys,
        >,
    ) -> Self {
        let journal = Journal::default();
        let creates = Arc::new(AtomicUsize::new(0));
        let create = {
            let journal = journal.clone();
            let creates = Arc::clone(&creates);
            tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
                journal.record("create");
                creates.fetch_add(1, Ordering::SeqCst);
                async move { Ok::<_, CreateError>(created_response()) }
            })
        };
        Self::build(journal, creates, Inner::new(create), configure)
    }

    /// A rig around a create of the caller's, made from the journal.
    pub fn around<S>(create: impl FnOnce(Journal) -> S) -> Self
    where
        S: Service<
                Request<RequestBody<Chunks>>,
                Response = Response<Full<Bytes>>,
                Error = CreateError,
            > + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        let journal = Journal::default();
        let create = Inner::new(create(journal.clone()));
        Self::build(journal, Arc::default(), create, |layer| layer)
    }

    /// A rig around a create of the caller's.
    pub fn build(
        journal: Journal,
        creates: Arc<AtomicUsize>,
        create: Inner,
        configure: impl FnOnce(
            RigLayer,
        ) -> IdempotencyLayer<
            RecordingStore,
            LabelContract,
            ScriptedAdmission,
            GlobalKeys,
        >,
    ) -> Self {
        let memory = MemoryStore::new();
        let store = RecordingStore::new(memory.clone(), journal.clone());
        let admission = ScriptedAdmission::new(journal.clone());
        let layer = configure(
            IdempotencyLayer::new(store.clone(), LabelContract)
                .global_keys()
                .admission(admission.clone()),
        );
        let service = tower::Layer::layer(&layer, create);
        Self {
            journal,
            memory,
            admission,
            creates,
            store,
            service,
        }
    }

    pub fn creates(&self) -> usize {
        self.creates.load(Ordering::SeqCst)
    }

    /// Sends one request, journals `write` when the response is produced, and returns it
    /// with its body read whole.
    pub async fn send(&self, request: Request<Chunks>) -> Reply {
        let response = self.service.clone().oneshot(request).await.unwrap();
        self.journal.record("write");
        Reply::read(response).await
    }

    /// Sends one request and checks the journal it left.
    pub async fn send_expecting(&self, request: Request<Chunks>, journal: &[&str]) -> Reply {
        self.journal.take();
        let reply = self.send(request).await;
        assert_eq!(self.journal.take(), journal, "journal");
        reply
    }
}

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub outcome: Option<tower_idempotency::Outcome>,
}

impl Reply {
    /// A response of the layer, its outcome read from its body.
    pub async fn read<B>(response: Response<tower_idempotency::body::ResponseBody<B>>) -> Self
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Debug,
    {
        let outcome = response.body().outcome();
        let mut reply = Self::read_any(response).await;
        reply.outcome = outcome;
        reply
    }

    /// Any response, its outcome read from its extensions (an outer layer replaced the
    /// layer's body: see `IdempotencyLayer::outcome_extension`).
    pub async fn read_any<B>(response: Response<B>) -> Self
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Debug,
    {
        let outcome = response.extensions().get().copied();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Self {
            status: parts.status,
            headers: parts.headers,
            body,
            outcome,
        }
    }

    /// Asserts the status, the exact body bytes and `Content-Type: application/json`.
    #[track_caller]
    pub fn exact(&self, status: u16, body: &str) -> &Self {
        assert_eq!(self.status.as_u16(), status, "status; body {:?}", self.body);
        assert_eq!(self.body, body.as_bytes(), "body");
        assert_eq!(
            self.values("content-type"),
            ["application/json"],
            "content-type"
        );
        self
    }

    /// Asserts every value of `name`, in order.
    #[track_caller]
    pub fn header(&self, name: &str, values: &[&str]) -> &Self {
        assert_eq!(self.values(name), values, "header {name}");
        self
    }

    pub fn values(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    /// Asserts this is the label contract's created response, value for value.
    #[track_caller]
    pub fn is_created(&self) -> &Self {
        self.exact(201, CREATED_BODY)
            .header("location", &["/labels/label-901"])
            .header("etag", &["\"label-901-v1\"", "\"backup\""]);
        assert_eq!(
            self.headers.len(),
            4,
            "exactly the stored headers: {:?}",
            self.headers
        );
        self
    }
}

/// A request body in chunks, as a chunked transfer delivers it.
#[derive(Debug, Default)]
pub struct Chunks(VecDeque<Bytes>);

impl Chunks {
    pub fn one(bytes: impl Into<Bytes>) -> Self {
        Self(VecDeque::from([bytes.into()]))
    }

    pub fn many<I: IntoIterator<Item = B>, B: Into<Bytes>>(chunks: I) -> Self {
        Self(chunks.into_iter().map(Into::into).collect())
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }
}

/// A request: method, path, key (if any), content type (if any), body in one chunk.
pub fn request(
    method: &str,
    path: &str,
    key: Option<&str>,
    content_type: Option<&str>,
    body: impl Into<Bytes>,
) -> Request<Chunks> {
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    if let Some(content_type) = content_type {
        builder = builder.header("content-type", content_type);
    }
    builder.body(Chunks::one(body)).unwrap()
}

/// The label contract's valid request.
pub fn valid() -> Request<Chunks> {
    request("POST", "/labels", Some(KEY), Some("application/json"), BODY)
}

/// A valid request for another operation.
pub fn operation(request_id: &str, parcel_id: &str) -> Request<Chunks> {
    let op = LabelOperation::new(request_id, parcel_id);
    request(
        "POST",
        "/labels",
        Some(request_id),
        Some("application/json"),
        op.to_json(),
    )
}

/// Drives a service ready and calls it, so a test can hold (or drop) the future.
pub async fn call<S, R>(service: &mut S, request: R) -> S::Future
where
    S: Service<R>,
    S::Error: std::fmt::Debug,
{
    service.ready().await.unwrap().call(request)
}

/// A rig whose create journals, counts, then waits at `gate` before answering.
pub fn rig_with_gated_create(gate: Arc<tokio::sync::Notify>) -> (Rig, Arc<AtomicUsize>) {
    let creates = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&creates);
    let rig = Rig::around(move |journal| {
        tower::service_fn(move |_| {
            journal.record("create");
            counter.fetch_add(1, Ordering::SeqCst);
            let gate = Arc::clone(&gate);
            async move {
                gate.notified().await;
                Ok::<_, CreateError>(created_response())
            }
        })
    });
    (
        Rig {
            creates: Arc::clone(&creates),
            ..rig
        },
        creates,
    )
}

/// Waits, up to five seconds, until `condition` holds.
pub async fn wait_for(condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// A service over `store` whose create counts into `creates`, takes `delay`, and answers the
/// label contract's 201.
pub fn counting_service<St: Store>(
    store: St,
    creates: Arc<AtomicUsize>,
    delay: std::time::Duration,
) -> Idempotency<Inner, St, LabelContract> {
    let create = tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
        creates.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, CreateError>(created_response())
        }
    });
    tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            store,
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        Inner::new(create),
    )
}

/// Sends one request through `service` and reads the reply.
pub async fn send_to<St: Store>(
    service: &Idempotency<Inner, St, LabelContract>,
    request: Request<Chunks>,
) -> Reply {
    Reply::read(service.clone().oneshot(request).await.unwrap()).await
}

/// Two replicas (a layer each, over stores with their own connections to one backend), `n`
/// concurrent identical requests split between them: exactly one create.
pub async fn replicas_create_once<St: Store>(a: St, b: St, n: usize) {
    let creates = Arc::new(AtomicUsize::new(0));
    let delay = std::time::Duration::from_millis(50);
    let replicas = [
        counting_service(a, Arc::clone(&creates), delay),
        counting_service(b, Arc::clone(&creates), delay),
    ];
    let key = conformance::unique_key("replicas");
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let service = replicas[i % 2].clone();
            let request = operation(&key, "parcel-42");
            tokio::spawn(async move { send_to(&service, request).await })
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::new();
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status.as_u16() {
            201 => assert_eq!(reply.body, CREATED_BODY),
            409 => assert_eq!(reply.body, r#"{"error":"request_pending"}"#),
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
        *statuses.entry(reply.status.as_u16()).or_insert(0) += 1;
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        1,
        "exactly one create: {statuses:?}"
    );
}

/// The store key the layer claims for `request_id` on `/labels`, without a scope.
pub fn key_of(request_id: &str) -> String {
    tower_idempotency::scope::store_key(None, &http::Method::POST, "/labels", request_id)
}

/// A gate that holds the first call that reaches it, and no later one.
#[derive(Clone, Default)]
pub struct OnceGate(Arc<Mutex<Option<Arc<tokio::sync::Notify>>>>);

impl OnceGate {
    pub fn new(gate: &Arc<tokio::sync::Notify>) -> Self {
        Self(Arc::new(Mutex::new(Some(Arc::clone(gate)))))
    }

    pub async fn pass(&self) {
        let gate = self.0.lock().unwrap().take();
        if let Some(gate) = gate {
            gate.notified().await;
        }
    }
}

/// A store whose first claim waits at a gate after it took effect (its answer "in flight"),
/// and whose first complete waits before it takes effect.
#[derive(Clone)]
pub struct GatedStore<St = MemoryStore> {
    pub inner: St,
    pub claim_gate: OnceGate,
    pub complete_gate: OnceGate,
}

impl<St: Store> Store for GatedStore<St> {
    async fn claim_with(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        reservation: Reservation,
        lease: Lease,
    ) -> Result<Claim, StoreError> {
        let claim = self
            .inner
            .claim_with(key, fingerprint, reservation, lease)
            .await;
        self.claim_gate.pass().await;
        claim
    }

    async fn complete(
        &self,
        key: &str,
        reservation: &Reservation,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.complete_gate.pass().await;
        self.inner.complete(key, reservation, response).await
    }

    fn changed<'a>(&'a self, key: &'a str) -> impl Future<Output = ()> + Send + 'a {
        self.inner.changed(key)
    }

    async fn renew(
        &self,
        key: &str,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner.renew(key, reservation, lease).await
    }

    async fn release(&self, key: &str, reservation: &Reservation) -> Result<(), StoreError> {
        self.inner.release(key, reservation).await
    }
}

/// The gap between create and complete (`LABEL_CONTRACT.md` §5): the store connection drops after the create and before the complete
/// (`cut` is called inside the create). The client still gets the created response, and
/// retries, once the store is back (`restore`), get `request_pending` or, once the lost
/// complete is settled, its replay; never a second create.
pub async fn crash_between_create_and_complete<St: Store>(
    store: St,
    cut: impl Fn() + Send + Sync + 'static,
    restore: impl Fn(),
) {
    // A connection made and the claim prepared, as on a server that has been running: the
    // first claim through a cold pool can outlast a short timeout on a loaded machine.
    let warm = conformance::unique_key("crash-warm");
    if let Ok(Claim::New(reservation)) = store
        .claim(
            &warm,
            &tower_idempotency::operation::LabelContract::fingerprint(&warm, "p"),
        )
        .await
    {
        let _ = store.release(&warm, &reservation).await;
    }
    let creates = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&creates);
    let cut = Arc::new(cut);
    let create = tower::service_fn(move |_: Request<RequestBody<Chunks>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        cut(); // the store is gone before the complete
        async { Ok::<_, CreateError>(created_response()) }
    });
    let service = tower::Layer::layer(
        &tower_idempotency::IdempotencyLayer::new(
            store,
            tower_idempotency::operation::LabelContract,
        )
        .global_keys(),
        Inner::new(create),
    );
    let key = conformance::unique_key("crash");
    let first = send_to(&service, operation(&key, "parcel-42")).await;
    assert_eq!(
        first.status, 201,
        "the create happened: its response is the reply"
    );
    assert_eq!(
        first.outcome,
        Some(tower_idempotency::Outcome::CompleteFailed)
    );

    restore();
    // The lost complete is settled in the background once the store is back: a retry gets
    // request_pending until then, the first attempt's response as a replay after.
    let pending_or_replay = |reply: Reply| {
        if reply.status == 409 {
            reply.exact(409, r#"{"error":"request_pending"}"#);
        } else {
            assert_eq!(reply.outcome, Some(tower_idempotency::Outcome::Replay));
            assert_eq!(reply.body, first.body, "the first attempt's response");
        }
    };
    pending_or_replay(send_until_answered(&service, || operation(&key, "parcel-42")).await);
    pending_or_replay(send_to(&service, operation(&key, "parcel-42")).await);
    assert_eq!(creates.load(Ordering::SeqCst), 1, "no second create");
}

/// The label contract's create as an axum handler: 201, JSON, the label contract's body for the operation.
pub async fn axum_create_label(
    axum::Json(op): axum::Json<LabelOperation>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(
            r#"{{"request_id":"{}","state":"created","label_id":"label-901"}}"#,
            op.request_id
        ),
    )
}

/// A store outage: with the backend away (`cut`), requests fail closed with `503
/// store_unavailable` within three timeouts and create nothing; once it is back (`restore`),
/// traffic recovers by itself, with no new service.
pub async fn outage_fails_closed_and_recovers<St: Store>(
    store: St,
    timeout: std::time::Duration,
    cut: impl FnOnce(),
    restore: impl FnOnce(),
) {
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store, Arc::clone(&creates), std::time::Duration::ZERO);
    let warmed = warm_up(&service, &creates).await;
    let key = conformance::unique_key("outage");
    cut();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        send_to(&service, operation(&key, "parcel-42"))
            .await
            .exact(503, r#"{"error":"store_unavailable"}"#)
            .header("retry-after", &["2"]);
        assert!(
            started.elapsed() < timeout * 3,
            "failed in {:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        warmed,
        "nothing created while the store is away"
    );
    restore();
    // A claim cut off mid-flight may have landed: the key is then pending until the process
    // that lost the answer settles it (a release, once the store answers), and a retry gets
    // request_pending meanwhile. Within seconds the retry creates, once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let reply = send_to(&service, operation(&key, "parcel-42")).await;
        if reply.status == 201 || std::time::Instant::now() > deadline {
            reply.exact(201, CREATED_BODY);
            break;
        }
        match reply.status.as_u16() {
            409 => assert_eq!(reply.body, r#"{"error":"request_pending"}"#),
            503 => {}
            other => panic!("unexpected {other} after the store came back"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(creates.load(Ordering::SeqCst), warmed + 1);
}

/// A store on an application's pool of one connection, called back to back by a task: someone
/// else in the pool's line (the application's handler, the store's own transaction settling
/// a lost claim) gets the connection while the calls go on, not only once they stop.
pub async fn the_pools_line_gets_a_turn_while_store_calls_go_on<St: Store, DB: sqlx::Database>(
    store: St,
    pool: sqlx::Pool<DB>,
) {
    use std::sync::atomic::AtomicBool;
    let fp = LabelContract::fingerprint("x", "y");
    let answered = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let caller = tokio::spawn({
        let (store, answered, stop) = (store.clone(), Arc::clone(&answered), Arc::clone(&stop));
        async move {
            // Bounded: on a store that never gives the connection up, the line gets it when
            // the calls stop, and the assertions below say so.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            while !stop.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                let key = conformance::unique_key("turn");
                if store.claim(&key, &fp).await.is_ok() {
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    let calls_going = || {
        let answered = &answered;
        let before = answered.load(Ordering::SeqCst);
        async move {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
            while answered.load(Ordering::SeqCst) < before + 3 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no store call answered"
                );
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    };
    calls_going().await;
    let connection = pool.acquire().await;
    assert!(connection.is_ok(), "{:?}", connection.err());
    assert!(
        !caller.is_finished(),
        "the application's handler got the connection only once the store's calls stopped"
    );
    drop(connection);
    // The store's own transaction: settling a claim whose answer was lost.
    let key = conformance::unique_key("turn-settle");
    let Ok(Claim::New(reservation)) = store.claim(&key, &fp).await else {
        panic!("a new claim");
    };
    calls_going().await;
    let settled = store.settle_claim(&key, &fp, reservation).await;
    assert!(settled.is_ok(), "{settled:?}");
    assert!(
        !caller.is_finished(),
        "the store's transaction got the connection only once the store's calls stopped"
    );
    stop.store(true, Ordering::SeqCst);
    caller.await.unwrap();
    // Calls that pause: the connection the last call kept goes back to the pool within its
    // turn, not after the second for which an unused connection used to be kept (found by a
    // review: a settling transaction waiting behind it timed out).
    assert!(
        store
            .claim(&conformance::unique_key("turn-pause"), &fp)
            .await
            .is_ok()
    );
    let started = std::time::Instant::now();
    let connection = pool.acquire().await;
    assert!(connection.is_ok(), "{:?}", connection.err());
    assert!(
        started.elapsed() < std::time::Duration::from_millis(900),
        "the pool had its connection back after {:?}",
        started.elapsed()
    );
}

/// Warms `service`: the pool's first connection is made within the store's short timeout,
/// which a loaded machine can miss; a warm-up refused so is tried again, under another key.
/// Returns the creates made.
pub async fn warm_up<St: Store>(
    service: &Idempotency<Inner, St, LabelContract>,
    creates: &AtomicUsize,
) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let warm = send_to(service, operation(&conformance::unique_key("warm"), "p")).await;
        if warm.status == 201 {
            warm.exact(201, CREATED_BODY);
            return creates.load(Ordering::SeqCst);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never warm: {}",
            warm.status
        );
    }
}

/// Sends until the store answers again (a reconnect takes a moment): the first reply that is
/// not `503`, or the last one after ten seconds.
pub async fn send_until_answered<St: Store>(
    service: &Idempotency<Inner, St, LabelContract>,
    request: impl Fn() -> Request<Chunks>,
) -> Reply {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let reply = send_to(service, request()).await;
        if reply.status != 503 || std::time::Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The refusal admission gives for a status: 429 or 503.
pub fn refusal(status: u16) -> tower_idempotency::admission::Refusal {
    match status {
        429 => tower_idempotency::admission::Refusal::TooManyRequests,
        _ => tower_idempotency::admission::Refusal::ServiceUnavailable,
    }
}

/// Claims whose answers are lost: `stall` (once it is in effect) holds the store for about 1.5 s (a paused Redis,
/// a locked table), longer than its timeout. Twenty requests meanwhile get `503
/// store_unavailable`; once the store answers again, each client's retry (it was told
/// `Retry-After: 2`) gets a 201 within a few seconds, and each key is created exactly once.
pub async fn lost_claim_answers_strand_no_key<St: Store>(
    store: St,
    stall: impl std::future::Future<Output = ()>,
) {
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store, Arc::clone(&creates), std::time::Duration::ZERO);
    let keys: Vec<String> = (0..20)
        .map(|i| conformance::unique_key(&format!("lost-{i}")))
        .collect();
    // Warm: scripts loaded, statements prepared, as on a server that has been running.
    let warm: Vec<_> = (0..keys.len())
        .map(|i| {
            let service = service.clone();
            let request = operation(&conformance::unique_key(&format!("warm-{i}")), "p");
            tokio::spawn(async move { send_to(&service, request).await })
        })
        .collect();
    for task in warm {
        task.await.unwrap().exact(201, CREATED_BODY);
    }
    creates.store(0, Ordering::SeqCst);
    stall.await;
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (service, request) = (service.clone(), operation(key, "parcel-42"));
            tokio::spawn(async move { send_to(&service, request).await })
        })
        .collect();
    for task in tasks {
        task.await
            .unwrap()
            .exact(503, r#"{"error":"store_unavailable"}"#)
            .header("retry-after", &["2"]);
    }
    assert_eq!(creates.load(Ordering::SeqCst), 0);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await; // Retry-After: 2
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    for key in &keys {
        loop {
            let reply = send_to(&service, operation(key, "parcel-42")).await;
            if reply.status == 201 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{key} stranded: {} {:?}",
                reply.status,
                reply.body
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        keys.len(),
        "one create per key"
    );
}

/// Answers lost after the send: the claim reaches the store and takes effect, its answer is
/// dropped (`mute`), the connection is then cut and restored. The client got `503`; after
/// `Retry-After` its retry gets a 201, and the key is created exactly once.
pub async fn answers_lost_after_the_send_strand_no_key<St: Store>(
    store: St,
    mute: impl FnOnce(),
    cut: impl FnOnce(),
    restore: impl FnOnce(),
) {
    let creates = Arc::new(AtomicUsize::new(0));
    let service = counting_service(store, Arc::clone(&creates), std::time::Duration::ZERO);
    let warmed = warm_up(&service, &creates).await;
    let key = conformance::unique_key("muted");
    mute();
    send_to(&service, operation(&key, "parcel-42"))
        .await
        .exact(503, r#"{"error":"store_unavailable"}"#);
    cut();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    restore();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await; // Retry-After: 2
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    loop {
        let reply = send_to(&service, operation(&key, "parcel-42")).await;
        if reply.status == 201 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stranded: {} {:?}",
            reply.status,
            reply.body
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        creates.load(Ordering::SeqCst),
        warmed + 1,
        "the warm-up and one create"
    );
}

/// A create that takes the number of milliseconds its `parcel_id` names (`"slow-400"`), and
/// panics for `"boom"` the first time it runs. It reads the body, as a handler does.
pub fn timed_create(journal: Journal, creates: Arc<AtomicUsize>) -> Inner {
    Inner::new(tower::service_fn(
        move |request: Request<RequestBody<Chunks>>| {
            journal.record("create");
            let first = creates.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                use http_body_util::BodyExt;
                let body = request.into_body().collect().await.unwrap().to_bytes();
                let op: LabelOperation = serde_json::from_slice(&body).unwrap();
                let parcel = op.parcel_id.to_string();
                assert!(!(first && parcel == "boom"), "the create panics");
                let millis = parcel.strip_prefix("slow-").and_then(|ms| ms.parse().ok());
                if let Some(millis) = millis {
                    tokio::time::sleep(Duration::from_millis(millis)).await;
                }
                Ok::<_, CreateError>(created_response())
            }
        },
    ))
}

/// Sends `request` in a task of its own; its reply, read whole.
pub fn spawn_send<S>(service: &S, request: Request<Chunks>) -> tokio::task::JoinHandle<Reply>
where
    S: tower::Service<
            Request<Chunks>,
            Response = http::Response<
                tower_idempotency::body::ResponseBody<http_body_util::Full<bytes::Bytes>>,
            >,
        > + Clone
        + Send
        + 'static,
    S::Error: std::fmt::Debug,
    S::Future: Send,
{
    let service = service.clone();
    tokio::spawn(async move { Reply::read(service.oneshot(request).await.unwrap()).await })
}

/// `pending_wait` on any store: a retry waiting for a first attempt that takes 300 ms answers
/// with the same bytes soon after it completes (within `within`: the store's poll interval and
/// a round trip where it does not notify), and a waiter on a second layer instance (its own
/// service, as another replica would have) is answered as well. One create.
pub async fn waiting_retries_get_the_first_attempts_bytes<St: Store>(
    replica_a: St,
    replica_b: St,
    within: std::time::Duration,
) {
    use tower::Layer;
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = |store: St| {
        IdempotencyLayer::new(store, LabelContract)
            .global_keys()
            .pending_wait(Duration::from_secs(5))
            .layer(timed_create(Journal::default(), Arc::clone(&creates)))
    };
    let (a, b) = (layer(replica_a), layer(replica_b));
    let key = format!("wait-{}", Reservation::generate());
    let first = spawn_send(&a, operation(&key, "slow-300"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let same = spawn_send(&a, operation(&key, "slow-300"));
    let other = spawn_send(&b, operation(&key, "slow-300"));
    let first = first.await.unwrap();
    let completed = std::time::Instant::now();
    for waiter in [same, other] {
        let reply = waiter.await.unwrap();
        assert!(completed.elapsed() < within, "{:?}", completed.elapsed());
        reply.is_created();
        assert_eq!(reply.body, first.body);
        assert_eq!(reply.outcome, Some(tower_idempotency::Outcome::Replay));
    }
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

/// `pending_wait` on a store two replicas share: fifty waiters on one key, split over both,
/// all answer with the first attempt's 201; while they wait each replica's store holds one
/// waited key however many wait on it (`waited` counts them), and none once they are answered.
/// A waiter whose client leaves mid-wait leaves nothing behind either.
pub async fn fifty_waiters_on_two_replicas<St: Store + Clone>(
    replica_a: St,
    replica_b: St,
    waited: impl Fn(&St) -> usize,
) {
    use tower::Layer;
    let creates = Arc::new(AtomicUsize::new(0));
    let layer = |store: St| {
        IdempotencyLayer::new(store, LabelContract)
            .global_keys()
            .pending_wait(Duration::from_secs(5))
            .layer(timed_create(Journal::default(), Arc::clone(&creates)))
    };
    let (a, b) = (layer(replica_a.clone()), layer(replica_b.clone()));
    let key = format!("fifty-{}", Reservation::generate());
    let first = spawn_send(&a, operation(&key, "slow-400"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waiters: Vec<_> = (0..50)
        .map(|i| {
            spawn_send(
                if i % 2 == 0 { &a } else { &b },
                operation(&key, "slow-400"),
            )
        })
        .collect();
    let left = b.clone().oneshot(operation(&key, "slow-400"));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), left)
            .await
            .is_err(),
        "still waiting when its client leaves"
    );
    assert_eq!(waited(&replica_a), 1, "one waited key on replica a");
    assert_eq!(waited(&replica_b), 1, "one waited key on replica b");
    let first = first.await.unwrap();
    first.is_created();
    for waiter in waiters {
        let reply = waiter.await.unwrap();
        reply.is_created();
        assert_eq!(reply.body, first.body);
        assert_eq!(reply.outcome, Some(tower_idempotency::Outcome::Replay));
    }
    assert_eq!(creates.load(Ordering::SeqCst), 1);
    wait_for(|| waited(&replica_a) == 0 && waited(&replica_b) == 0).await;
}

/// A body of some data, then frames of trailers (a gRPC response's: one).
pub struct Trailing {
    pub data: Option<Bytes>,
    pub trailers: VecDeque<HeaderMap>,
}

impl Body for Trailing {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match self.data.take() {
            Some(data) => Some(Frame::data(data)),
            None => self.trailers.pop_front().map(Frame::trailers),
        };
        Poll::Ready(frame.map(Ok))
    }
}

/// Claims `key` as new in `store` and completes it with a stored response.
pub async fn complete_new<St: Store>(store: &St, key: &str) {
    let fingerprint = LabelContract::fingerprint(key, "p");
    let Ok(tower_idempotency::store::Claim::New(reservation)) =
        store.claim(key, &fingerprint).await
    else {
        panic!("{key}: a new key is new");
    };
    let response = tower_idempotency::testing::conformance::awkward_response();
    store.complete(key, &reservation, &response).await.unwrap();
}

/// What a claim of `key` (completed by [`complete_new`]) answers now: a replay or a new claim.
pub async fn claimed_again<St: Store>(store: &St, key: &str) -> &'static str {
    match store
        .claim(key, &LabelContract::fingerprint(key, "p"))
        .await
        .unwrap()
    {
        tower_idempotency::store::Claim::Replay(_) => "replay",
        tower_idempotency::store::Claim::New(_) => "new",
        _ => "other",
    }
}

/// Under a steady stream of 400 completed keys through `store` (one every few milliseconds),
/// a purger with a short retention holds the store steady: in the last quarter of the stream
/// `count` (the records it holds) stays under half the stream, and once the stream stops the
/// store empties of them.
pub async fn purger_holds_steady<St, F, Fut>(store: &St, count: F)
where
    St: Store,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let creates = 400;
    let mut most = 0;
    for i in 0..creates {
        let key = conformance::unique_key(&format!("steady-{i}"));
        complete_new(store, &key).await;
        if i >= creates * 3 / 4 && i % 10 == 0 {
            most = most.max(count().await);
        }
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    assert!(
        most < 200,
        "{most} of {creates} records held at the end of the run"
    );
    let emptied = std::time::Instant::now();
    while count().await > 0 {
        assert!(
            emptied.elapsed() < std::time::Duration::from_secs(10),
            "the purger empties the store"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `claims` claims of new keys through `store`, one every few milliseconds, in a task of their
/// own: each must be new (answered within the store's timeout); the task yields how many were.
pub fn claims_meanwhile<St: Store>(store: St, claims: usize) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut answered = 0;
        for i in 0..claims {
            let key = conformance::unique_key(&format!("meanwhile-{i}"));
            let claim = store
                .claim(&key, &LabelContract::fingerprint(&key, "p"))
                .await;
            assert!(
                matches!(claim, Ok(tower_idempotency::store::Claim::New(_))),
                "{claim:?}"
            );
            answered += 1;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        answered
    })
}

/// The operator's tool (`idempotency_keys`, feature `cli`) run with `args` on the label
/// contract's endpoint (`--path /labels`) unless they name another path: its exit code, what it
/// printed, and what it said on its error output.
#[cfg(feature = "cli")]
pub fn operator_tool(args: &[&str]) -> (Option<i32>, String, String) {
    operator_tool_with(args, &[])
}

/// [`operator_tool`] with more variables in its environment.
#[cfg(feature = "cli")]
pub fn operator_tool_with(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let labels: &[&str] = if args.contains(&"--path") {
        &[]
    } else {
        &["--path", "/labels"]
    };
    let all: Vec<&str> = labels.iter().chain(args).copied().collect();
    operator_tool_as_given(&all, env)
}

/// The operator's tool run with exactly `args`.
#[cfg(feature = "cli")]
pub fn operator_tool_as_given(
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idempotency_keys"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the tool runs");
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}
