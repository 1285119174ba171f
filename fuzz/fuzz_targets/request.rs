//! What both fuzz targets share: the request they build from their input, and the create.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use tower_idempotency::layer::RequestBody;

/// Splits the input into method, path, content type, key and body at `\n`s.
pub fn request(data: &[u8]) -> Option<http::Request<Full<Bytes>>> {
    let mut parts = data.splitn(5, |b| *b == b'\n');
    let method = http::Method::from_bytes(parts.next()?).ok()?;
    let path = std::str::from_utf8(parts.next()?).ok()?;
    let content_type = parts.next()?;
    let key = parts.next()?;
    let body = Bytes::copy_from_slice(parts.next().unwrap_or_default());
    let mut builder = http::Request::builder().method(method).uri(path);
    if let Ok(value) = http::HeaderValue::from_bytes(content_type) {
        builder = builder.header("content-type", value);
    }
    if let Ok(value) = http::HeaderValue::from_bytes(key) {
        builder = builder.header("idempotency-key", value);
    }
    builder.body(Full::new(body)).ok()
}

/// A create that counts its calls and answers 201 with `body`.
pub fn counting_create(
    body: &'static [u8],
) -> (
    Arc<AtomicUsize>,
    impl tower::Service<
        http::Request<RequestBody<Full<Bytes>>>,
        Response = http::Response<Full<Bytes>>,
        Error = Infallible,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
) {
    let creates = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&creates);
    let create = tower::service_fn(move |_: http::Request<RequestBody<Full<Bytes>>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(
            http::Response::builder()
                .status(201)
                .body(Full::new(Bytes::from_static(body)))
                .unwrap(),
        ))
    });
    (creates, create)
}
