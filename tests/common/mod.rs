//! The contract's test rig: a journal of calls, a recording store, admission and create, and
//! requests and assertions in the contract's words.
#![allow(dead_code, unreachable_pub)]

pub use tower_idempotency::testing::conformance;
pub mod labels;
pub mod payments;
pub mod proxy;
pub mod scenarios;
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
use tower_idempotency::layer::Idempotency;
use tower_idempotency::layer::RequestBody;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::operation::{Fingerprint, LabelOperation};
use tower_idempotency::scope::GlobalKeys;
use tower_idempotency::store::Store;
use tower_idempotency::store::{Claim, Lease, Reservation, StoreError, StoredResponse};
use tower_idempotency::{IdempotencyLayer, MemoryStore};

pub use tower_idempotency::testing::{Journal, RecordingStore, ScriptedAdmission};

pub use self::labels::{BODY, CREATED_BODY, KEY, created_response};
#[allow(unused_imports)]
pub use self::scenarios::*;

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
    pub outcome: Option<tower_idempotency::reply::Outcome>,
}

impl Reply {
    /// A response of the layer, its outcome read from its body.
    pub async fn read<B>(response: Response<tower_idempotency::layer::ResponseBody<B>>) -> Self
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

/// The refusal admission gives for a status: 429 or 503.
pub fn refusal(status: u16) -> tower_idempotency::admission::Refusal {
    match status {
        429 => tower_idempotency::admission::Refusal::TooManyRequests,
        _ => tower_idempotency::admission::Refusal::ServiceUnavailable,
    }
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
                tower_idempotency::layer::ResponseBody<http_body_util::Full<bytes::Bytes>>,
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
        tower_idempotency::store::Claim::Expired(_) => "expired",
        _ => "other",
    }
}

/// The operator's tool (`idempotency_keys`, the `idempotency-keys` crate's command, built by
/// the workspace's tests) run with `args` on the label
/// contract's endpoint (`--path /labels`) unless they name another path: its exit code, what it
/// printed, and what it said on its error output.
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]
pub fn operator_tool(args: &[&str]) -> (Option<i32>, String, String) {
    operator_tool_with(args, &[])
}

/// [`operator_tool`] with more variables in its environment.
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]
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
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]
pub fn operator_tool_as_given(
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let output = std::process::Command::new(operator_tool_path())
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

/// The operator's tool beside this test binary, as `cargo test --workspace` builds it (it is
/// another crate's command, which a test of this one cannot name by `CARGO_BIN_EXE_`).
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite"
))]
fn operator_tool_path() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target/<profile>/deps");
    let tool = dir.join(format!("idempotency_keys{}", std::env::consts::EXE_SUFFIX));
    assert!(
        tool.exists(),
        "{} is not built: run the store tests with `cargo test --workspace --all-features`, \
         or build it first with `cargo build -p idempotency-keys`",
        tool.display()
    );
    tool
}
