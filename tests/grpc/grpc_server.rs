//! The gRPC example's stack on loopback (`examples/grpc_labels`): tonic's server with
//! tonic-web outside the layer, `labels.v1.Labels/CreateLabel` guarded by `GrpcOperation`,
//! the health service beside it. Calls from a tonic client over HTTP/2 and as gRPC-web frames
//! over HTTP/1.1.

#[path = "../../examples/grpc_labels/mod.rs"]
mod grpc_labels;

use std::net::SocketAddr;
use std::time::Duration;

use grpc_labels::{Labels, LabelsClient, UNKNOWN_PARCEL, operation, web};
use tokio::sync::oneshot;
use tonic::Code;
use tower_idempotency::admission::{Admission, AlwaysAdmit, Refusal};
use tower_idempotency::operation::GrpcOperation;
use tower_idempotency::scope::GlobalKeys;
use tower_idempotency::store::Store;
use tower_idempotency::testing::{Journal, RecordingStore, ScriptedAdmission};
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// A server on a free port, stopped when dropped.
struct Server {
    addr: SocketAddr,
    labels: Labels,
    _stop: oneshot::Sender<()>,
}

async fn start_with<St, A>(
    layer: IdempotencyLayer<St, GrpcOperation, A, GlobalKeys>,
    delay: Duration,
) -> Server
where
    St: Store,
    A: Admission<tower_idempotency::operation::IdempotencyKey> + Clone,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let labels = Labels::new(delay);
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = labels.clone();
    tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        grpc_labels::serve(listener, layer, serving, shutdown)
            .await
            .unwrap();
    });
    Server {
        addr,
        labels,
        _stop: stop,
    }
}

/// The example's layer on `store`, with `delay` per create.
async fn start(store: MemoryStore, delay: Duration) -> Server {
    start_with(
        IdempotencyLayer::new(store, operation()).global_keys(),
        delay,
    )
    .await
}

async fn client(server: &Server) -> LabelsClient {
    LabelsClient::connect(server.addr).await.unwrap()
}

#[tokio::test]
async fn over_grpc_web_the_create_and_its_replay_carry_the_status_trailers() {
    let server = start(MemoryStore::new(), Duration::ZERO).await;
    let first = web::create_label(server.addr, Some("w-1"), "w-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(first.http, 200);
    assert_eq!(first.status(), Some("0"), "{first:?}");
    let label = first.label().unwrap();
    assert_eq!(label.request_id, "w-1");
    let replay = web::create_label(server.addr, Some("w-1"), "w-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(replay, first, "the same message bytes and trailers");
    assert_eq!(server.labels.creates(), 1);
}

/// The response's metadata that is not set per connection (`date`, say).
fn metadata(response: &tonic::Response<grpc_labels::Label>) -> Vec<(String, String)> {
    let mut kept: Vec<_> = response
        .metadata()
        .clone()
        .into_headers()
        .iter()
        .filter(|(name, _)| *name != "date")
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
        .collect();
    kept.sort();
    kept
}

#[tokio::test]
async fn over_http2_a_create_is_replayed_with_the_same_message_and_metadata() {
    let server = start(MemoryStore::new(), Duration::ZERO).await;
    let mut client = client(&server).await;
    let first = client
        .create_label(Some("h-1"), "h-1", "parcel-42")
        .await
        .unwrap();
    let replay = client
        .create_label(Some("h-1"), "h-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(metadata(&replay), metadata(&first));
    assert!(
        metadata(&first)
            .iter()
            .any(|(name, _)| name == "x-label-id"),
        "{:?}",
        metadata(&first)
    );
    assert_eq!(replay.get_ref(), first.get_ref());
    assert_eq!(first.get_ref().request_id, "h-1");
    assert_eq!(first.get_ref().state, "created");
    // Over gRPC-web the same stored answer: the same message.
    let over_web = web::create_label(server.addr, Some("h-1"), "h-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(over_web.label().as_ref(), Some(first.get_ref()));
    assert_eq!(over_web.status(), Some("0"));
    assert_eq!(server.labels.creates(), 1);
}

#[tokio::test]
async fn conflicts_missing_and_wrong_keys_are_grpc_statuses_and_create_nothing() {
    let store = MemoryStore::new();
    let server = start(store.clone(), Duration::ZERO).await;
    let mut client = client(&server).await;
    client
        .create_label(Some("c-1"), "c-1", "parcel-42")
        .await
        .unwrap();

    let conflict = client
        .create_label(Some("c-1"), "c-1", "parcel-43")
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::FailedPrecondition);
    assert_eq!(conflict.message(), "idempotency_conflict");
    let conflict = web::create_label(server.addr, Some("c-1"), "c-1", "parcel-43")
        .await
        .unwrap();
    assert_eq!((conflict.http, conflict.status()), (200, Some("9")));
    assert_eq!(
        conflict.trailer("grpc-message"),
        Some("idempotency_conflict")
    );

    for (key, request_id) in [(None, "c-2"), (Some("c-3"), "c-4"), (Some("c-5"), "")] {
        let refused = client
            .create_label(key, request_id, "parcel-42")
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "{key:?} {request_id}"
        );
        assert_eq!(refused.message(), "invalid_request");
        let refused = web::create_label(server.addr, key, request_id, "parcel-42")
            .await
            .unwrap();
        assert_eq!(refused.status(), Some("3"), "{key:?} {request_id}");
    }
    assert_eq!(server.labels.creates(), 1);
    assert_eq!(store.len(), 1, "nothing refused reached the store");
}

#[tokio::test]
async fn a_call_while_the_first_runs_is_aborted_on_both_transports() {
    let server = start(MemoryStore::new(), Duration::from_secs(2)).await;
    let mut first_client = client(&server).await;
    let first = tokio::spawn(async move {
        first_client
            .create_label(Some("p-1"), "p-1", "parcel-42")
            .await
    });
    server.labels.begun(1).await; // claimed, and creating for two seconds
    let pending = client(&server)
        .await
        .create_label(Some("p-1"), "p-1", "parcel-42")
        .await
        .unwrap_err();
    assert_eq!(pending.code(), Code::Aborted);
    assert_eq!(pending.message(), "request_pending");
    let pending = web::create_label(server.addr, Some("p-1"), "p-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(pending.status(), Some("10"));
    assert_eq!(pending.trailer("grpc-message"), Some("request_pending"));
    assert!(pending.message.is_empty(), "trailers only");
    assert_eq!(server.labels.creates(), 0, "both answered while it ran");
    first.await.unwrap().unwrap();
    assert_eq!(server.labels.creates(), 1);
}

#[tokio::test]
async fn admission_refusals_release_the_key_and_name_the_case() {
    let admission = ScriptedAdmission::new(Journal::new());
    let layer = IdempotencyLayer::new(MemoryStore::new(), operation())
        .global_keys()
        .admission(admission.clone());
    let server = start_with(layer, Duration::ZERO).await;
    let mut client = client(&server).await;
    for (refusal, code) in [
        (Refusal::TooManyRequests, Code::ResourceExhausted),
        (Refusal::ServiceUnavailable, Code::Unavailable),
    ] {
        admission.refuse(Some(refusal));
        let refused = client
            .create_label(Some("a-1"), "a-1", "parcel-42")
            .await
            .unwrap_err();
        assert_eq!(refused.code(), code, "{refusal:?}");
        assert_eq!(refused.message(), "not_admitted");
        let refused = web::create_label(server.addr, Some("a-1"), "a-1", "parcel-42")
            .await
            .unwrap();
        assert_eq!(
            refused.status(),
            Some(&*(code as i32).to_string()),
            "{refusal:?}"
        );
    }
    assert_eq!(server.labels.creates(), 0);
    admission.refuse(None);
    let created = client
        .create_label(Some("a-1"), "a-1", "parcel-42")
        .await
        .expect("the refusals released the key");
    assert_eq!(created.get_ref().request_id, "a-1");
    assert_eq!(server.labels.creates(), 1);
}

#[tokio::test]
async fn a_store_that_fails_is_unavailable_and_nothing_is_created() {
    let store = RecordingStore::new(MemoryStore::new(), Journal::new());
    store.fail("claim");
    let layer = IdempotencyLayer::new(store.clone(), operation())
        .global_keys()
        .admission(AlwaysAdmit);
    let server = start_with(layer, Duration::ZERO).await;
    let mut client = client(&server).await;
    let failed = client
        .create_label(Some("s-1"), "s-1", "parcel-42")
        .await
        .unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
    assert_eq!(failed.message(), "store_unavailable");
    let failed = web::create_label(server.addr, Some("s-1"), "s-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(failed.status(), Some("14"));
    assert_eq!(server.labels.creates(), 0);
    store.recover();
    client
        .create_label(Some("s-1"), "s-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(server.labels.creates(), 1);
}

#[tokio::test]
async fn a_create_that_fails_with_a_status_is_stored_and_replayed() {
    let server = start(MemoryStore::new(), Duration::ZERO).await;
    let mut client = client(&server).await;
    let first = client
        .create_label(Some("f-1"), "f-1", UNKNOWN_PARCEL)
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::NotFound);
    let replay = client
        .create_label(Some("f-1"), "f-1", UNKNOWN_PARCEL)
        .await
        .unwrap_err();
    assert_eq!(
        (replay.code(), replay.message()),
        (first.code(), first.message())
    );
    let over_web = web::create_label(server.addr, Some("f-1"), "f-1", UNKNOWN_PARCEL)
        .await
        .unwrap();
    assert_eq!(over_web.status(), Some("5"));
    assert_eq!(server.labels.creates(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_identical_calls_create_once() {
    let server = start(MemoryStore::new(), Duration::from_millis(300)).await;
    let clients = [client(&server).await, client(&server).await];
    let calls: Vec<_> = (0..1000)
        .map(|i| {
            let mut client = clients[i % 2].clone();
            tokio::spawn(async move { client.create_label(Some("m-1"), "m-1", "parcel-42").await })
        })
        .collect();
    let mut labels = Vec::new();
    let mut pending = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(response) => labels.push(response.into_inner()),
            Err(status) => {
                assert_eq!(
                    (status.code(), status.message()),
                    (Code::Aborted, "request_pending")
                );
                pending += 1;
            }
        }
    }
    assert_eq!(server.labels.creates(), 1);
    assert!(!labels.is_empty(), "the first call answers its create");
    assert!(labels.iter().all(|label| *label == labels[0]), "one label");
    assert_eq!(labels.len() + pending, 1000);
    // Afterwards every call replays it.
    let replay = client(&server)
        .await
        .create_label(Some("m-1"), "m-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(replay.into_inner(), labels[0]);
}

#[tokio::test]
async fn a_client_that_cancels_mid_create_leaves_a_create_the_retry_replays() {
    let server = start(MemoryStore::new(), Duration::from_millis(300)).await;
    let mut cancelled = client(&server).await;
    let call = tokio::spawn(async move {
        cancelled
            .create_label(Some("x-1"), "x-1", "parcel-42")
            .await
    });
    server.labels.begun(1).await;
    call.abort(); // the client goes away mid-create: its stream is reset
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(server.labels.creates(), 0, "cancelled while the create ran");
    // The create runs to its end without its client; then the retry replays it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let retry = loop {
        match client(&server)
            .await
            .create_label(Some("x-1"), "x-1", "parcel-42")
            .await
        {
            Err(status) if status.code() == Code::Aborted => {
                assert!(tokio::time::Instant::now() < deadline, "still pending");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answer => break answer.unwrap(),
        }
    };
    assert_eq!(retry.get_ref().request_id, "x-1");
    assert_eq!(
        server.labels.creates(),
        1,
        "the retry replayed the first create"
    );
    let again = web::create_label(server.addr, Some("x-1"), "x-1", "parcel-42")
        .await
        .unwrap();
    assert_eq!(again.label().as_ref(), Some(retry.get_ref()));
}

#[tokio::test]
async fn the_health_service_and_its_stream_pass_through_untouched() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let store = MemoryStore::new();
    let server = start(store.clone(), Duration::ZERO).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let request = || HealthCheckRequest {
        service: "labels.v1.Labels".to_owned(),
    };
    let checked = health.check(request()).await.unwrap().into_inner();
    assert_eq!(checked.status(), ServingStatus::Serving);
    // Watch is server-streaming: its first message arrives, the stream stays open.
    let mut watch = health.watch(request()).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    assert_eq!(store.len(), 0, "no key, no record: not guarded");
}

/// The client layer under a tonic client, against the example's server: the reply of each
/// call's first attempt is lost after the server answered, and some attempts time out while
/// their create runs (the retry then finds it pending, `ABORTED`, and tries again). Every
/// call gets its label, and the server creates one label a call.
#[cfg(feature = "client")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_client_through_the_client_layer_gets_one_label_a_call() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use tower::retry::budget::TpsBudget;
    use tower::{BoxError, Layer, ServiceExt};
    use tower_idempotency::client::{Attempts, ClientLayer};

    let server = start(MemoryStore::new(), Duration::from_millis(300)).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // Loses the first answer of each key, read whole with its trailers, after the server
    // made it.
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let lossy = tower::service_fn(move |request: http::Request<Full<Bytes>>| {
        let (channel, seen) = (channel.clone(), Arc::clone(&seen));
        async move {
            let key = request.headers()["idempotency-key"].to_str()?.to_owned();
            let request = request.map(tonic::body::Body::new);
            let response = channel.oneshot(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?;
            let times = {
                let mut seen = seen.lock().unwrap();
                let times = seen.entry(key).or_default();
                *times += 1;
                *times
            };
            if times == 1 {
                return Err::<http::Response<http_body_util::Collected<Bytes>>, BoxError>(
                    "connection reset after the answer".into(),
                );
            }
            Ok(http::Response::from_parts(parts, body))
        }
    });
    // Retries enough, and far enough apart, to outlast a create of 300 ms on a loaded machine.
    let layer = ClientLayer::new()
        .backoff(Duration::from_millis(5), Duration::from_millis(100))
        .max_attempts(100)
        .budget(TpsBudget::new(Duration::from_secs(10), 100, 1.0));
    let plain = layer.clone().layer(lossy.clone());
    // Gives up on an attempt before its create ends: the retry finds the key pending.
    let impatient = layer
        .attempt_timeout(Duration::from_millis(100))
        .layer(lossy);
    let calls = 6;
    let mut answers = Vec::new();
    for i in 0..calls {
        let client = match i % 2 {
            0 => impatient.clone(),
            _ => plain.clone(),
        };
        answers.push(tokio::spawn(create_label_through(
            client,
            format!("call-{i}"),
        )));
    }
    let mut labels = std::collections::HashSet::new();
    for answer in answers {
        let (key, answer) = answer.await.unwrap();
        let answer = answer.unwrap_or_else(|status| panic!("{key}: {status:?}"));
        assert!(answer.extensions().get::<Attempts>().is_some());
        let label = answer.into_inner();
        assert_eq!(label.request_id, key);
        labels.insert(label.label_id);
    }
    assert_eq!(labels.len(), calls, "a label a call");
    assert_eq!(server.labels.creates(), calls, "one create a call");
}

/// `CreateLabel` through `client` (a tonic client's service), with `key` as the request id and
/// the `idempotency-key`. A generic function, so that its future is `Send` for a spawn with a
/// service whose error is `BoxError`.
#[cfg(feature = "client")]
async fn create_label_through<T>(
    client: T,
    key: String,
) -> (
    String,
    Result<tonic::Response<grpc_labels::Label>, tonic::Status>,
)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tower::BoxError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    use grpc_labels::{CREATE_LABEL, CreateLabelRequest, Label};
    let mut request = tonic::Request::new(CreateLabelRequest {
        request_id: key.clone(),
        parcel_id: "parcel-42".to_owned(),
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    let mut grpc = tonic::client::Grpc::new(client);
    if let Err(error) = grpc.ready().await {
        return (
            key,
            Err(tonic::Status::unavailable(error.into().to_string())),
        );
    }
    let answer = grpc
        .unary(
            request,
            http::uri::PathAndQuery::from_static(CREATE_LABEL),
            tonic_prost::ProstCodec::<CreateLabelRequest, Label>::default(),
        )
        .await;
    (key, answer)
}
