//! The request both fuzz targets build from their input.

use bytes::Bytes;
use http_body_util::Full;

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
