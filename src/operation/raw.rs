//! [`RawOperation`]: a create endpoint whose body is any bytes (a form, a file).

use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderValue, Method};

use super::json::target;
use super::key::{keyed, keyed_head};
use super::{Fingerprint, Head, IdempotencyKey, Operation, Parsed, media};
use crate::rejection::Rejection;

/// A create endpoint whose body is any bytes: a form, an upload. The key is the
/// `Idempotency-Key` header as for [`JsonOperation`](crate::JsonOperation); the fingerprint is
/// SHA-256 over the method, the path with its query, the `Content-Type` values and the exact
/// body bytes. Refusals are problem details, as for `JsonOperation`.
///
/// Every content type is read unless [`media_types`](Self::media_types) names the ones
/// accepted. The inner service gets the [`IdempotencyKey`] in the request extensions.
///
/// ```
/// use http::Method;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency::operation::RawOperation;
///
/// let operation = RawOperation::new()
///     .methods([Method::POST, Method::PUT])
///     .media_types(["application/x-www-form-urlencoded"]);
/// let layer = IdempotencyLayer::new(MemoryStore::new(), operation).global_keys();
/// # drop(layer);
/// ```
#[derive(Debug, Clone)]
pub struct RawOperation {
    methods: Arc<[Method]>,
    media_types: Option<Arc<[String]>>,
    problem_base: Option<Arc<str>>,
}

impl RawOperation {
    /// `POST` with any body.
    pub fn new() -> Self {
        Self {
            methods: Arc::new([Method::POST]),
            media_types: None,
            problem_base: None,
        }
    }

    /// The methods guarded; others pass through. Default `POST`.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The media types accepted (compared case-insensitively, parameters allowed); any other
    /// `Content-Type`, or none, is a `415`.
    pub fn media_types<'a>(mut self, media_types: impl IntoIterator<Item = &'a str>) -> Self {
        self.media_types = Some(media_types.into_iter().map(str::to_owned).collect());
        self
    }

    /// Writes the `type` of every problem this operation answers under `base`, as
    /// [`JsonOperation::problem_type_base`](crate::JsonOperation::problem_type_base) does.
    ///
    /// ```
    /// use tower_idempotency::operation::{Operation, RawOperation};
    /// use tower_idempotency::reply::Rejection;
    ///
    /// let operation = RawOperation::new().problem_type_base("https://api.example.com/problems/");
    /// let pending = operation.reply(&Rejection::Pending);
    /// assert!(pending.body().starts_with(br#"{"type":"https://api.example.com/problems/request_pending""#));
    /// ```
    pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
        self.problem_base = Some(Arc::from(base.into()));
        self
    }
}

impl Default for RawOperation {
    fn default() -> Self {
        Self::new()
    }
}

impl Operation for RawOperation {
    type Value = IdempotencyKey;

    fn reply(&self, rejection: &Rejection) -> http::Response<Bytes> {
        crate::problem::reply_under(rejection, self.problem_base.as_deref())
    }

    fn head(&self, parts: &Parts) -> Head {
        if !self.methods.contains(&parts.method) {
            return Head::PassThrough;
        }
        if let Some(accepted) = &self.media_types {
            let media = media::media_type(&parts.headers);
            if !media.is_some_and(|media| accepted.iter().any(|a| a.eq_ignore_ascii_case(media))) {
                return Head::Reject(Rejection::UnsupportedMediaType);
            }
        }
        keyed_head(parts)
    }

    fn parse<'a>(
        &self,
        parts: &'a Parts,
        body: &Bytes,
    ) -> Result<Parsed<'a, IdempotencyKey>, Rejection> {
        let [method, path] = target(parts);
        // Every `Content-Type` value, after a count: none and an empty one differ.
        let content_types = parts.headers.get_all(CONTENT_TYPE);
        let count = (content_types.iter().count() as u64).to_be_bytes();
        let fields = [method, path, &count[..]]
            .into_iter()
            .chain(content_types.iter().map(HeaderValue::as_bytes))
            .chain([&body[..]]);
        keyed(parts, Fingerprint::digest(fields))
    }
}
