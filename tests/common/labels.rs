//! The label contract's operation and created response, shared by the tests and the benches.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

/// The label contract's created response body.
pub const CREATED_BODY: &str =
    r#"{"request_id":"label-req-7","state":"created","label_id":"label-901"}"#;
/// The label contract's operation.
pub const BODY: &str = r#"{"request_id":"label-req-7","parcel_id":"parcel-42"}"#;
/// Its key.
pub const KEY: &str = "label-req-7";

/// The label contract's created response: 201 with `Content-Type`, `Location`, two `ETag`s and the
/// label contract's body.
pub fn created_response() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(CREATED_BODY.as_bytes())));
    *response.status_mut() = StatusCode::CREATED;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::LOCATION,
        HeaderValue::from_static("/labels/label-901"),
    );
    headers.append(header::ETAG, HeaderValue::from_static("\"label-901-v1\""));
    headers.append(header::ETAG, HeaderValue::from_static("\"backup\""));
    response
}
