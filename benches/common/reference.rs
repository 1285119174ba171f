//! A plain reference layer: the least correct work that makes the label contract's create
//! idempotent, written as anyone would write it first, to measure the layer against.
//!
//! It does what the contract needs and nothing else: the content type and the key checked, the
//! body read whole (at most 64 KiB) and parsed with serde, its `request_id` matched with the
//! key, the fingerprint a SHA-256 of the parcel, then one map behind one mutex: a key absent is
//! marked pending and created, the created response read whole and kept; a key completed with
//! the same fingerprint is answered with a copy of what was kept; another fingerprint is `422`,
//! a pending key `409`. What it leaves out is what the layer adds beyond that: leases and their
//! take-over, a bound on the records, retention, admission, a create whose caller went away, the
//! hop-by-hop headers, the stores' fencing.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use sha2::{Digest, Sha256};
use tower::{Layer, Service};

/// The reference layer over one shared map.
#[derive(Clone, Default)]
pub struct ReferenceLayer {
    records: Arc<Mutex<HashMap<String, Record>>>,
}

enum Record {
    Pending([u8; 32]),
    Done([u8; 32], StatusCode, HeaderMap, Bytes),
}

#[derive(serde::Deserialize)]
struct Label {
    request_id: String,
    parcel_id: String,
}

impl<S> Layer<S> for ReferenceLayer {
    type Service = Reference<S>;

    fn layer(&self, inner: S) -> Reference<S> {
        Reference {
            inner,
            records: Arc::clone(&self.records),
        }
    }
}

/// The reference layer's service.
#[derive(Clone)]
pub struct Reference<S> {
    inner: S,
    records: Arc<Mutex<HashMap<String, Record>>>,
}

fn answer(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::default());
    *response.status_mut() = status;
    response
}

impl<S, B> Service<Request<B>> for Reference<S>
where
    S: Service<Request<Bytes>, Response = Response<Full<Bytes>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut inner = self.inner.clone();
        let records = Arc::clone(&self.records);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            if parts
                .headers
                .get(header::CONTENT_TYPE)
                .map(|v| v.as_bytes())
                != Some(b"application/json")
            {
                return Ok(answer(StatusCode::UNSUPPORTED_MEDIA_TYPE));
            }
            let Some(key) = parts
                .headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
            else {
                return Ok(answer(StatusCode::BAD_REQUEST));
            };
            let Ok(body) = Limited::new(body, 64 * 1024).collect().await else {
                return Ok(answer(StatusCode::PAYLOAD_TOO_LARGE));
            };
            let body = body.to_bytes();
            let Ok(label) = serde_json::from_slice::<Label>(&body) else {
                return Ok(answer(StatusCode::UNPROCESSABLE_ENTITY));
            };
            if label.request_id != key {
                return Ok(answer(StatusCode::UNPROCESSABLE_ENTITY));
            }
            let fingerprint: [u8; 32] = Sha256::digest(label.parcel_id.as_bytes()).into();
            {
                let mut records = records.lock().expect("the map");
                match records.get(&key) {
                    None => {
                        records.insert(key.clone(), Record::Pending(fingerprint));
                    }
                    Some(Record::Done(kept, status, headers, body)) if *kept == fingerprint => {
                        let mut response = Response::new(Full::new(body.clone()));
                        *response.status_mut() = *status;
                        *response.headers_mut() = headers.clone();
                        return Ok(response);
                    }
                    Some(Record::Pending(_)) => return Ok(answer(StatusCode::CONFLICT)),
                    Some(Record::Done(..)) => {
                        return Ok(answer(StatusCode::UNPROCESSABLE_ENTITY));
                    }
                }
            }
            let created = inner.call(Request::from_parts(parts, body)).await?;
            let (parts, body) = created.into_parts();
            let Ok(body) = body.collect().await.map(|b| b.to_bytes());
            records.lock().expect("the map").insert(
                key,
                Record::Done(
                    fingerprint,
                    parts.status,
                    parts.headers.clone(),
                    body.clone(),
                ),
            );
            Ok(Response::from_parts(parts, Full::new(body)))
        })
    }
}
