//! What every bench sends and the create it guards: the lesson's operation and response.
#![allow(dead_code)]

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::Full;
use tower::Service;

#[path = "../../tests/common/lesson.rs"]
mod lesson;

/// The lesson's create, answering at once: 201, `Content-Type`, `Location`, two `ETag`s.
#[derive(Clone, Copy, Debug, Default)]
pub struct Create;

impl<B> Service<Request<B>> for Create {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        std::future::ready(Ok(lesson::created_response()))
    }
}

/// `POST /labels` with a key, a content type and a body.
pub fn request(
    key: &str,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    Request::post("/labels")
        .header(header::CONTENT_TYPE, content_type)
        .header("idempotency-key", key)
        .body(Full::new(body.into()))
        .expect("a valid request")
}

/// A valid attempt of the operation `key` for `parcel-42`.
pub fn valid(key: &str) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"request_id":"{key}","parcel_id":"parcel-42"}}"#);
    request(key, "application/json", body)
}
