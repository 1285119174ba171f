//! The `labels.v1` gRPC service of the gRPC example, its server stack and a client, shared by
//! `grpc_label_server`, the tests and the benches. The messages are written by hand with
//! `prost`'s derive, so no `protoc` is needed:
//!
//! ```proto
//! package labels.v1;
//! service Labels { rpc CreateLabel(CreateLabelRequest) returns (Label); }
//! message CreateLabelRequest { string request_id = 1; string parcel_id = 2; }
//! message Label { string request_id = 1; string label_id = 2; string state = 3; }
//! ```
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use prost::Message;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;
use tower::Service;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::admission::Admission;
use tower_idempotency::operation::GrpcOperation;
use tower_idempotency::operation::{GrpcCall, IdempotencyKey};
use tower_idempotency::scope::GlobalKeys;
use tower_idempotency::store::Store;

/// The guarded method's path.
pub const CREATE_LABEL: &str = "/labels.v1.Labels/CreateLabel";

/// `labels.v1.CreateLabelRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct CreateLabelRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(string, tag = "2")]
    pub parcel_id: String,
}

/// `labels.v1.Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(string, tag = "2")]
    pub label_id: String,
    #[prost(string, tag = "3")]
    pub state: String,
}

/// The operation guarding `CreateLabel`: keyed by the `idempotency-key` metadata entry, which
/// must equal the message's `request_id` (the label contract's rule); a message that does not decode,
/// or has an empty field, is `INVALID_ARGUMENT` too.
pub fn operation() -> GrpcOperation {
    GrpcOperation::new()
        .method(CREATE_LABEL)
        .validate(|call: &GrpcCall<'_>| {
            // The service accepts no compressed message, so neither does its check.
            if call.is_compressed() {
                return Err("compressed messages are not accepted");
            }
            let request = CreateLabelRequest::decode(call.message())
                .map_err(|_| "not a labels.v1.CreateLabelRequest")?;
            if request.request_id.is_empty() || request.parcel_id.is_empty() {
                return Err("request_id and parcel_id are required");
            }
            if request.request_id != call.key() {
                return Err("the idempotency-key must equal request_id");
            }
            Ok(())
        })
}

/// The parcel for which `CreateLabel` answers `NOT_FOUND`: a create that fails with a status,
/// stored and replayed like any other answer.
pub const UNKNOWN_PARCEL: &str = "parcel-unknown";

/// The `labels.v1.Labels` service: each `CreateLabel` creates a label with a new id, after
/// `delay`, and counts it.
#[derive(Clone)]
pub struct Labels {
    inner: Arc<Inner>,
}

struct Inner {
    delay: Duration,
    /// Creates begun.
    begun: AtomicUsize,
    /// Creates finished.
    creates: AtomicUsize,
    /// What makes ids unique across the processes of one store.
    prefix: String,
}

impl Labels {
    /// A service whose creates take `delay`.
    pub fn new(delay: Duration) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        Self {
            inner: Arc::new(Inner {
                delay,
                begun: AtomicUsize::new(0),
                creates: AtomicUsize::new(0),
                prefix: format!("{:x}-{}", nanos, std::process::id()),
            }),
        }
    }

    /// The creates run so far.
    pub fn creates(&self) -> usize {
        self.inner.creates.load(Ordering::SeqCst)
    }

    /// Waits until `n` creates have begun (their calls claimed), for at most five seconds.
    pub async fn begun(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.inner.begun.load(Ordering::SeqCst) < n {
            assert!(tokio::time::Instant::now() < deadline, "no create began");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn create(
        inner: Arc<Inner>,
        request: Request<CreateLabelRequest>,
    ) -> Result<Response<Label>, Status> {
        inner.begun.fetch_add(1, Ordering::SeqCst);
        if !inner.delay.is_zero() {
            tracing::info!(request_id = %request.get_ref().request_id, "create started");
            tokio::time::sleep(inner.delay).await;
        }
        let n = inner.creates.fetch_add(1, Ordering::SeqCst) + 1;
        let request = request.into_inner();
        if request.parcel_id == UNKNOWN_PARCEL {
            return Err(Status::not_found(format!(
                "no parcel {}",
                request.parcel_id
            )));
        }
        let label_id = format!("label-{}-{n}", inner.prefix);
        let mut response = Response::new(Label {
            request_id: request.request_id,
            label_id: label_id.clone(),
            state: "created".to_owned(),
        });
        if let Ok(value) = label_id.parse() {
            response.metadata_mut().insert("x-label-id", value);
        }
        Ok(response)
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B> Service<http::Request<B>> for Labels
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != CREATE_LABEL {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let inner = self.inner.clone();
        Box::pin(async move {
            let create = tower::service_fn(move |request| Self::create(inner.clone(), request));
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<Label, CreateLabelRequest>::default());
            Ok(grpc.unary(create, request).await)
        })
    }
}

impl NamedService for Labels {
    const NAME: &'static str = "labels.v1.Labels";
}

/// Serves `labels` and `grpc.health.v1.Health` (reporting every service as serving) on
/// `listener` until `shutdown`, HTTP/2 gRPC and gRPC-web over HTTP/1.1 on the same port:
/// tonic-web's layer outside, so that gRPC-web calls reach the idempotency layer as gRPC.
pub async fn serve<St, A>(
    listener: tokio::net::TcpListener,
    layer: IdempotencyLayer<St, GrpcOperation, A, GlobalKeys>,
    labels: Labels,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    St: Store,
    A: Admission<IdempotencyKey> + Clone,
{
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<Labels>().await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tonic::transport::Server::builder()
        .accept_http1(true)
        .layer(tonic_web::GrpcWebLayer::new())
        .layer(layer)
        .add_service(health)
        .add_service(labels)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            shutdown,
        )
        .await
}

/// A client of `labels.v1.Labels` over a tonic channel (HTTP/2).
#[derive(Clone)]
pub struct LabelsClient {
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
}

impl LabelsClient {
    /// Connects to `http://{addr}`.
    pub async fn connect(addr: SocketAddr) -> Result<Self, tonic::transport::Error> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        Ok(Self {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    /// `CreateLabel` with `key` as its `idempotency-key` (none if `None`).
    pub async fn create_label(
        &mut self,
        key: Option<&str>,
        request_id: &str,
        parcel_id: &str,
    ) -> Result<Response<Label>, Status> {
        let mut request = Request::new(CreateLabelRequest {
            request_id: request_id.to_owned(),
            parcel_id: parcel_id.to_owned(),
        });
        if let Some(key) = key {
            let key = key
                .parse()
                .map_err(|_| Status::invalid_argument("a key must be visible ASCII"))?;
            request.metadata_mut().insert("idempotency-key", key);
        }
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        self.grpc
            .unary(
                request,
                PathAndQuery::from_static(CREATE_LABEL),
                ProstCodec::<CreateLabelRequest, Label>::default(),
            )
            .await
    }
}

/// A gRPC-web call of `CreateLabel` over HTTP/1.1, as a browser sends it: the request, and the
/// answer's status, the message (if any) and the trailers, read from the body's frames.
pub mod web {
    use bytes::{Buf, Bytes};
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use prost::Message;

    use super::{CREATE_LABEL, CreateLabelRequest, Label};

    /// What a gRPC-web call answered.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Answer {
        /// The HTTP status.
        pub http: u16,
        /// The data frames' messages, concatenated (the message bytes as sent).
        pub message: Bytes,
        /// The trailers frame, as sent (`name:value\r\n` lines).
        pub trailers: String,
    }

    impl Answer {
        /// The `grpc-status` trailer, or the header of a trailers-only reply.
        pub fn status(&self) -> Option<&str> {
            self.trailer("grpc-status")
        }

        /// The value of trailer `name`.
        pub fn trailer(&self, name: &str) -> Option<&str> {
            self.trailers.split("\r\n").find_map(|line| {
                let (n, v) = line.split_once(':')?;
                n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
            })
        }

        /// The message decoded as a `Label`.
        pub fn label(&self) -> Option<Label> {
            Label::decode(self.message.clone()).ok()
        }
    }

    /// The request body: one uncompressed frame of `message`.
    pub fn frame(message: &[u8]) -> Vec<u8> {
        let mut framed = vec![0];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(message);
        framed
    }

    /// `CreateLabel` over HTTP/1.1 as gRPC-web, to `addr`.
    pub async fn create_label(
        addr: std::net::SocketAddr,
        key: Option<&str>,
        request_id: &str,
        parcel_id: &str,
    ) -> Result<Answer, String> {
        let message = CreateLabelRequest {
            request_id: request_id.to_owned(),
            parcel_id: parcel_id.to_owned(),
        }
        .encode_to_vec();
        let mut request = http::Request::post(format!("http://{addr}{CREATE_LABEL}"))
            .header("content-type", "application/grpc-web+proto")
            .header("x-grpc-web", "1");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request
            .body(Full::new(Bytes::from(frame(&message))))
            .map_err(|e| e.to_string())?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let http = response.status().as_u16();
        // A trailers-only reply carries its status in the headers.
        let in_headers: String = response
            .headers()
            .iter()
            .filter(|(name, _)| name.as_str().starts_with("grpc-"))
            .map(|(name, value)| format!("{name}:{}\r\n", value.to_str().unwrap_or("")))
            .collect();
        let mut trailers = String::new();
        let mut body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let mut message = Vec::new();
        while body.has_remaining() {
            if body.remaining() < 5 {
                return Err("a truncated gRPC-web frame header".to_owned());
            }
            let flag = body.get_u8();
            let length = body.get_u32() as usize;
            if body.remaining() < length {
                return Err("a truncated gRPC-web frame".to_owned());
            }
            let payload = body.split_to(length);
            match flag {
                0x80 => trailers.push_str(&String::from_utf8_lossy(&payload)),
                0 => message.extend_from_slice(&payload),
                _ => return Err(format!("a gRPC-web frame flagged {flag:#x}")),
            }
        }
        if trailers.is_empty() {
            trailers = in_headers;
        }
        Ok(Answer {
            http,
            message: message.into(),
            trailers,
        })
    }
}
