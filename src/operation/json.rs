//! [`JsonOperation`]: any JSON create endpoint, per draft-ietf-httpapi-idempotency-key-header.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use http::request::Parts;
use serde::de::{DeserializeOwned, IgnoredAny};

use super::jcs::{self, Node, Pointer};
use super::key::key_in;
use super::{Fingerprint, Head, Operation, Parsed, media};
use crate::reply::Rejection;

type Validate<T> = Arc<dyn Fn(&T) -> Result<(), Cow<'static, str>> + Send + Sync>;

/// Any JSON create endpoint, as draft-ietf-httpapi-idempotency-key-header describes it.
///
/// - **Guarded methods**: `POST` by default ([`methods`](Self::methods) adds `PATCH`, say);
///   other methods pass through untouched, so a `GET` on the same route is not guarded.
/// - **The key**: one `Idempotency-Key` header, 1 to 255 visible ASCII characters, bare or as a
///   Structured Field string ([`IdempotencyKey`](crate::operation::IdempotencyKey)); checked before the body is read.
/// - **The body**: `Content-Type: application/json` or `application/…+json`, at most the body
///   limit (16 KiB unless the layer sets another), one JSON value with no member name twice.
///   With a type ([`JsonOperation::typed`]) it must deserialize into it and pass the
///   [`validate`](Self::validate) hook; the inner service gets the value in the request
///   extensions (and the unchanged body, so axum's `Json<T>` works too).
/// - **The fingerprint**: SHA-256 over the method, the path with its query, the media type,
///   and the body in canonical JSON (RFC 8785): member order, whitespace, escapes and number
///   spelling (`1.0` and `1`) do not change it. Numbers are doubles, as RFC 8785 reads them;
///   an integer literal a double cannot hold exactly (past 2^53) is refused, since a typed
///   body would read it otherwise — send such values as strings. [`fingerprint_only`](Self::fingerprint_only) and
///   [`fingerprint_except`](Self::fingerprint_except) narrow it with JSON pointers.
/// - **Refusals** are RFC 9457 `application/problem+json`:
///
#[doc = include_str!("../reply/problem.md")]
///
/// Keys are client-chosen, so the layer asks for a [scope](crate::IdempotencyLayer::scope)
/// or an explicit [`global_keys`](crate::IdempotencyLayer::global_keys).
///
/// ```
/// use http::{Request, Response, StatusCode};
/// use serde::Deserialize;
/// use tower::{ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
/// use tower_idempotency::body::RequestBody;
///
/// #[derive(Clone, Deserialize)]
/// struct NewPayment { amount: u64, currency: String }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let operation = JsonOperation::<NewPayment>::typed()
///     .validate(|p| if p.amount >= 1 { Ok(()) } else { Err("amount must be at least 1".into()) });
/// let layer = IdempotencyLayer::new(MemoryStore::new(), operation).global_keys();
/// let service = tower::Layer::layer(&layer, service_fn(|request: Request<RequestBody<String>>| async move {
///     let payment = request.extensions().get::<NewPayment>().unwrap();
///     let body = format!(r#"{{"amount":{},"currency":"{}"}}"#, payment.amount, payment.currency);
///     Ok::<_, std::convert::Infallible>(Response::builder().status(201).body(body).unwrap())
/// }));
///
/// let attempt = |body: &'static str| Request::post("/payments")
///     .header("content-type", "application/json")
///     .header("idempotency-key", "\"pay-1\"")
///     .body(body.to_owned())
///     .unwrap();
/// let created = service.clone().oneshot(attempt(r#"{"amount":5,"currency":"EUR"}"#)).await.unwrap();
/// assert_eq!(created.status(), StatusCode::CREATED);
/// // Another serializer's spelling of the same payload is a replay, not a conflict.
/// let replay = service.clone().oneshot(attempt(r#"{ "currency": "\u0045UR", "amount": 5 }"#)).await.unwrap();
/// assert_eq!(replay.status(), StatusCode::CREATED);
/// let reused = service.oneshot(attempt(r#"{"amount":6,"currency":"EUR"}"#)).await.unwrap();
/// assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
/// # }
/// ```
pub struct JsonOperation<T = IgnoredAny> {
    config: Arc<Config<T>>,
}

struct Config<T> {
    methods: Vec<Method>,
    key_member: Option<Pointer>,
    fingerprint: Selection,
    validate: Option<Validate<T>>,
    value: PhantomData<fn() -> T>,
}

impl<T> Clone for Config<T> {
    fn clone(&self) -> Self {
        Self {
            methods: self.methods.clone(),
            key_member: self.key_member.clone(),
            fingerprint: self.fingerprint.clone(),
            validate: self.validate.clone(),
            value: PhantomData,
        }
    }
}

/// Which parts of the body the fingerprint covers.
#[derive(Debug, Clone)]
enum Selection {
    Whole,
    Only(Vec<Pointer>),
    Except(Vec<Pointer>),
}

impl JsonOperation {
    /// Any JSON body, untyped: the syntax is checked, nothing is deserialized.
    pub fn new() -> Self {
        Self::typed()
    }
}

impl Default for JsonOperation {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for JsonOperation<T> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
        }
    }
}

impl<T> fmt::Debug for JsonOperation<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonOperation")
            .field("type", &std::any::type_name::<T>())
            .field("methods", &self.config.methods)
            .field("key_member", &self.config.key_member)
            .field("fingerprint", &self.config.fingerprint)
            .field("validate", &self.config.validate.is_some())
            .finish()
    }
}

impl<T> JsonOperation<T> {
    /// A body that must deserialize into `T`; the inner service gets the `T` in the request
    /// extensions.
    pub fn typed() -> Self {
        Self {
            config: Arc::new(Config {
                methods: vec![Method::POST],
                key_member: None,
                fingerprint: Selection::Whole,
                validate: None,
                value: PhantomData,
            }),
        }
    }

    fn config(&mut self) -> &mut Config<T> {
        Arc::make_mut(&mut self.config)
    }

    /// Checks every deserialized value; an `Err` is a `400` with its text as the problem's
    /// detail.
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    ///
    /// #[derive(Clone, serde::Deserialize)]
    /// struct Refund { amount: u64 }
    ///
    /// let operation = JsonOperation::<Refund>::typed()
    ///     .validate(|r| if r.amount >= 1 { Ok(()) } else { Err("amount must be at least 1".into()) });
    /// # drop(operation);
    /// ```
    pub fn validate<F>(mut self, validate: F) -> Self
    where
        F: Fn(&T) -> Result<(), Cow<'static, str>> + Send + Sync + 'static,
    {
        self.config().validate = Some(Arc::new(validate));
        self
    }

    /// The methods guarded; others pass through. Default `POST`.
    ///
    /// ```
    /// use http::Method;
    /// use tower_idempotency::JsonOperation;
    ///
    /// let operation = JsonOperation::new().methods([Method::POST, Method::PATCH]);
    /// # drop(operation);
    /// ```
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config().methods = methods.into_iter().collect();
        self
    }

    /// Requires the body member at `pointer` (a JSON pointer, `/request_id`) to be a string
    /// equal to the key, else `400`: the lesson's rule, for any body.
    ///
    /// # Panics
    ///
    /// If `pointer` is not a JSON pointer (RFC 6901).
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    ///
    /// let operation = JsonOperation::new().key_member("/request_id");
    /// # drop(operation);
    /// ```
    pub fn key_member(mut self, pointer: &str) -> Self {
        self.config().key_member = Some(pointer_or_panic(pointer));
        self
    }

    /// Fingerprints only the members at these JSON pointers (with the method, the path and the
    /// query); a member that is absent counts as absent.
    ///
    /// # Panics
    ///
    /// If a pointer is not a JSON pointer (RFC 6901).
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    ///
    /// let operation = JsonOperation::new().fingerprint_only(["/amount", "/currency"]);
    /// # drop(operation);
    /// ```
    pub fn fingerprint_only<'a>(mut self, pointers: impl IntoIterator<Item = &'a str>) -> Self {
        self.config().fingerprint =
            Selection::Only(pointers.into_iter().map(pointer_or_panic).collect());
        self
    }

    /// Fingerprints the body without the members at these JSON pointers: for clients that add
    /// a per-attempt field, such as a timestamp.
    ///
    /// # Panics
    ///
    /// If a pointer is not a JSON pointer (RFC 6901).
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    ///
    /// let operation = JsonOperation::new().fingerprint_except(["/sent_at"]);
    /// # drop(operation);
    /// ```
    pub fn fingerprint_except<'a>(mut self, pointers: impl IntoIterator<Item = &'a str>) -> Self {
        self.config().fingerprint =
            Selection::Except(pointers.into_iter().map(pointer_or_panic).collect());
        self
    }
}

fn pointer_or_panic(pointer: &str) -> Pointer {
    match Pointer::parse(pointer) {
        Some(pointer) => pointer,
        None => panic!("{pointer:?} is not a JSON pointer (RFC 6901): write \"/member\""),
    }
}

/// The method, and the path with its query, as the fingerprint and the raw operation read them.
pub(super) fn target(parts: &Parts) -> [&[u8]; 2] {
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    [parts.method.as_str().as_bytes(), path.as_bytes()]
}

impl<T> Operation for JsonOperation<T>
where
    T: DeserializeOwned + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn head(&self, parts: &Parts) -> Head {
        if !self.config.methods.contains(&parts.method) {
            Head::PassThrough
        } else if !media::is_json_family(&parts.headers) {
            Head::Reject(Rejection::UnsupportedMediaType)
        } else if key_in(&parts.headers).is_none() {
            Head::Reject(Rejection::InvalidKey)
        } else {
            Head::Guard
        }
    }

    fn parse<'a>(&self, parts: &'a Parts, body: &Bytes) -> Result<Parsed<'a, T>, Rejection> {
        let key = key_in(&parts.headers).ok_or(Rejection::InvalidKey)?;
        let mut document = jcs::parse(body).map_err(|why| Rejection::invalid(why.to_string()))?;
        let value: T =
            serde_json::from_slice(body).map_err(|error| Rejection::invalid(error.to_string()))?;
        if let Some(validate) = &self.config.validate {
            validate(&value).map_err(Rejection::InvalidRequest)?;
        }
        if let Some(pointer) = &self.config.key_member
            && !matches!(document.get(pointer), Some(Node::String(member)) if *member == *key)
        {
            return Err(Rejection::invalid(format!(
                "the member {} must be a string equal to the Idempotency-Key",
                pointer.as_str()
            )));
        }
        let fingerprint = self.fingerprint(parts, &mut document, body.len());
        Ok(Parsed {
            key,
            fingerprint,
            value,
        })
    }
}

impl<T> JsonOperation<T> {
    fn fingerprint(&self, parts: &Parts, document: &mut Node, body_len: usize) -> Fingerprint {
        let [method, path] = target(parts);
        // `application/merge-patch+json` and `application/json` bodies mean different things.
        let media_type = media::media_type(&parts.headers).unwrap_or_default();
        // Lowercase as nearly every client sends it: a copy only for one that is not.
        let media_type: Cow<'_, str> = if media_type.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(media_type.to_ascii_lowercase())
        } else {
            Cow::Borrowed(media_type)
        };
        let mut canonical = Vec::new();
        match &self.config.fingerprint {
            Selection::Whole => {
                // Room for the body's canonical form at once: it is the body less its
                // whitespace, unless its escapes or numbers are written longer.
                canonical.reserve(body_len);
                document.write_canonical(&mut canonical);
            }
            Selection::Except(pointers) => {
                canonical.reserve(body_len);
                for pointer in pointers {
                    document.remove(pointer);
                }
                document.write_canonical(&mut canonical);
            }
            Selection::Only(pointers) => {
                // Each pointer, then its value's canonical form or, if absent, a byte that no
                // canonical JSON starts with.
                let mut members = Vec::with_capacity(pointers.len());
                let mut value = Vec::new();
                for pointer in pointers {
                    value.clear();
                    match document.get(pointer) {
                        Some(node) => node.write_canonical(&mut value),
                        None => value.push(0xFF),
                    }
                    members.push(Fingerprint::digest([pointer.as_str().as_bytes(), &value]));
                }
                canonical.reserve(2 * 32 * members.len());
                for member in members {
                    canonical.extend_from_slice(member.to_hex().as_bytes());
                }
            }
        }
        Fingerprint::digest([method, path, media_type.as_bytes(), &canonical])
    }
}
