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
use super::key::{is_key, key_in};
use super::{Fingerprint, Head, IDEMPOTENCY_KEY, Operation, Parsed, media};
use crate::outcome::Invalid;
use crate::rejection::Rejection;

type Validate<T> = Arc<dyn Fn(&T) -> Result<(), Invalid> + Send + Sync>;

/// Any JSON create endpoint, as draft-ietf-httpapi-idempotency-key-header describes it.
///
/// - **Guarded methods**: `POST` by default; [`methods`](Self::methods) adds others, such as
///   `PATCH`. Other methods pass through untouched, so a `GET` on the same route is not
///   guarded.
/// - **The key**: one `Idempotency-Key` header, 1 to 255 visible ASCII characters, bare or as a
///   Structured Field string; see [`IdempotencyKey`](crate::operation::IdempotencyKey). It is
///   checked before the body is read. With [`key_from`](Self::key_from) the key is a body
///   member instead.
/// - **The body**: `Content-Type: application/json` or `application/…+json`, one JSON value
///   with no member name twice, at most the body limit: 16 KiB unless the layer sets another.
///   With a type, given by [`JsonOperation::typed`], it must deserialize into it and pass the
///   [`validate`](Self::validate) hook; the inner service gets the value in the request
///   extensions, and the unchanged body too, so axum's `Json<T>` works as well.
/// - **The fingerprint**: SHA-256 over the method, the path with its query, the media type, and
///   the body in RFC 8785 canonical JSON: member order, whitespace, escapes and number
///   spelling, such as `1.0` against `1`, do not change it. Numbers are doubles, as RFC
///   8785 reads them; an integer literal a double cannot hold exactly, past 2^53, is refused,
///   since a typed body would read it otherwise — send such values as strings.
///   [`fingerprint_only`](Self::fingerprint_only) and
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
/// use tower_idempotency::layer::RequestBody;
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
    /// Whether the `T` goes into the request extensions by default.
    hand_over: bool,
    methods: Vec<Method>,
    key: KeySource,
    fingerprint: Selection,
    validate: Option<Validate<T>>,
    problem_base: Option<Arc<str>>,
    value: PhantomData<fn() -> T>,
}

impl<T> Clone for Config<T> {
    fn clone(&self) -> Self {
        Self {
            hand_over: self.hand_over,
            methods: self.methods.clone(),
            key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            validate: self.validate.clone(),
            problem_base: self.problem_base.clone(),
            value: PhantomData,
        }
    }
}

/// Where the key is read.
#[derive(Debug, Clone)]
enum KeySource {
    /// The `Idempotency-Key` header.
    Header,
    /// The header, and a body member that must equal it ([`JsonOperation::key_member`]).
    HeaderAndMember(Pointer),
    /// A body member; the header, if sent too, must equal it ([`JsonOperation::key_from`]).
    Member(Pointer),
}

/// Which parts of the body the fingerprint covers.
#[derive(Debug, Clone)]
enum Selection {
    Whole,
    Only(Vec<Pointer>),
    Except(Vec<Pointer>),
}

impl JsonOperation {
    /// Any JSON body, untyped: the syntax is checked, nothing is deserialized, and nothing is
    /// handed to the inner service beside the body; its handler reads the body.
    pub fn new() -> Self {
        let mut operation = Self::typed();
        operation.config().hand_over = false;
        operation
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
            .field("hands_over_value", &self.config.hand_over)
            .field("methods", &self.config.methods)
            .field("key", &self.config.key)
            .field("fingerprint", &self.config.fingerprint)
            .field("validate", &self.config.validate.is_some())
            .finish()
    }
}

impl<T> JsonOperation<T> {
    /// A body that must deserialize into `T`; the inner service gets the `T` in the request
    /// extensions, which axum reads as `Extension<T>`, unless the layer's
    /// [`value_extension(false)`](crate::IdempotencyLayer::value_extension) says otherwise.
    pub fn typed() -> Self {
        Self {
            config: Arc::new(Config {
                hand_over: true,
                methods: vec![Method::POST],
                key: KeySource::Header,
                fingerprint: Selection::Whole,
                validate: None,
                problem_base: None,
                value: PhantomData,
            }),
        }
    }

    fn config(&mut self) -> &mut Config<T> {
        Arc::make_mut(&mut self.config)
    }

    /// Checks every deserialized value; an `Err` is a `400` whose problem carries it: a plain
    /// reason as the detail, `Err("…".into())`, or a reason about one member, [`Invalid::at`],
    /// also in the problem's `errors` with its JSON pointer.
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    /// use tower_idempotency::reply::Invalid;
    ///
    /// #[derive(Clone, serde::Deserialize)]
    /// struct Refund { amount: u64, reason: String }
    ///
    /// let operation = JsonOperation::<Refund>::typed().validate(|r| {
    ///     if r.amount < 1 {
    ///         return Err(Invalid::at("/amount", "must be at least 1"));
    ///     }
    ///     if r.reason.is_empty() { Err("a refund needs a reason".into()) } else { Ok(()) }
    /// });
    /// # drop(operation);
    /// ```
    pub fn validate<F>(mut self, validate: F) -> Self
    where
        F: Fn(&T) -> Result<(), Invalid> + Send + Sync + 'static,
    {
        self.config().validate = Some(Arc::new(validate));
        self
    }

    /// Writes the `type` of every problem this operation answers under `base`, the
    /// documentation of your own API, rather than under
    /// [`DEFAULT_TYPE_BASE`](crate::problem::DEFAULT_TYPE_BASE): the type is `base` followed by
    /// the case's name; see [problem types](crate::problem#problem-types).
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    /// use tower_idempotency::operation::Operation;
    /// use tower_idempotency::reply::Rejection;
    ///
    /// let operation = JsonOperation::new().problem_type_base("https://api.example.com/problems/");
    /// let conflict = operation.reply(&Rejection::Conflict);
    /// assert!(conflict.body().starts_with(br#"{"type":"https://api.example.com/problems/idempotency_conflict""#));
    /// ```
    pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
        self.config().problem_base = Some(Arc::from(base.into()));
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

    /// Requires the body member at `pointer`, a JSON pointer such as `/request_id`, to be a
    /// string equal to the `Idempotency-Key` header, else `400` about that member: for bodies
    /// that carry a copy of their key. [`key_from`](Self::key_from) takes the key from the body
    /// instead; the last of the two called decides.
    ///
    /// # Errors
    ///
    /// If `pointer` is not an RFC 6901 JSON pointer: neither empty nor starting with `/`, or
    /// with a `~` not followed by `0` or `1`.
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    ///
    /// let operation = JsonOperation::new().key_member("/request_id")?;
    /// assert!(JsonOperation::new().key_member("request_id").is_err());
    /// # drop(operation);
    /// # Ok::<(), tower_idempotency::operation::InvalidPointer>(())
    /// ```
    pub fn key_member(mut self, pointer: &str) -> Result<Self, InvalidPointer> {
        self.config().key = KeySource::HeaderAndMember(pointer_of_text(pointer)?);
        Ok(self)
    }

    /// Takes the key from the body member at `pointer`, a JSON pointer such as `/idempotency_key`,
    /// rather than from the `Idempotency-Key` header: for protocols that carry the key in the
    /// request itself, such as AdCP's `idempotency_key`, an MCP tool call's arguments or Google
    /// AIP-155's `request_id`. The member must be a string of 1 to 255 visible ASCII characters, as
    /// a header's key, else `400 invalid_request` about that member. A request may send the header
    /// too: then it must be a valid key, else `400 invalid_idempotency_key`, and equal to the
    /// member, else `400 invalid_request` about the member. A client that adds the header itself,
    /// as this crate's `client::ClientLayer` does, must give it the body's key as its `IntentKey`.
    /// The key space, the fingerprint and every other answer are the same as with the header.
    ///
    /// # Errors
    ///
    /// If `pointer` is not an RFC 6901 JSON pointer.
    ///
    /// ```
    /// use http::{Request, Response};
    /// use tower::{Layer, ServiceExt, service_fn};
    /// use tower_idempotency::layer::RequestBody;
    /// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
    /// use tower_idempotency::reply::Outcome;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let operation = JsonOperation::new().key_from("/idempotency_key")?;
    /// let create = service_fn(|_: Request<RequestBody<String>>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::new(String::from("{}")))
    /// });
    /// let service = IdempotencyLayer::new(MemoryStore::new(), operation).global_keys().layer(create);
    /// let request = || {
    ///     Request::post("/media_buys")
    ///         .header("content-type", "application/json")
    ///         .body(String::from(r#"{"idempotency_key":"buy-7","budget":500}"#))
    /// };
    /// let first = service.clone().oneshot(request()?).await?;
    /// let retry = service.oneshot(request()?).await?;
    /// assert_eq!(first.body().outcome(), Some(Outcome::Created));
    /// assert_eq!(retry.body().outcome(), Some(Outcome::Replay));
    /// # Ok(()) }
    /// ```
    pub fn key_from(mut self, pointer: &str) -> Result<Self, InvalidPointer> {
        self.config().key = KeySource::Member(pointer_of_text(pointer)?);
        Ok(self)
    }

    /// Fingerprints only the members at these JSON pointers, along with the method, the path
    /// and the query; a member that is absent counts as absent.
    ///
    /// # Errors
    ///
    /// If a pointer is not an RFC 6901 JSON pointer.
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    ///
    /// let operation = JsonOperation::new().fingerprint_only(["/amount", "/currency"])?;
    /// # drop(operation);
    /// # Ok::<(), tower_idempotency::operation::InvalidPointer>(())
    /// ```
    pub fn fingerprint_only<'a>(
        mut self,
        pointers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, InvalidPointer> {
        let pointers = pointers.into_iter().map(pointer_of_text);
        self.config().fingerprint = Selection::Only(pointers.collect::<Result<_, _>>()?);
        Ok(self)
    }

    /// Fingerprints the body without the members at these JSON pointers: for clients that add
    /// a per-attempt field, such as a timestamp.
    ///
    /// # Errors
    ///
    /// If a pointer is not an RFC 6901 JSON pointer.
    ///
    /// ```
    /// use tower_idempotency::JsonOperation;
    ///
    /// let operation = JsonOperation::new().fingerprint_except(["/sent_at"])?;
    /// let refused = JsonOperation::new().fingerprint_except(["/ok", "sent_at"]).unwrap_err();
    /// assert_eq!(refused.to_string(), r#""sent_at" is not a JSON pointer (RFC 6901): write "/member""#);
    /// # drop(operation);
    /// # Ok::<(), tower_idempotency::operation::InvalidPointer>(())
    /// ```
    pub fn fingerprint_except<'a>(
        mut self,
        pointers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, InvalidPointer> {
        let pointers = pointers.into_iter().map(pointer_of_text);
        self.config().fingerprint = Selection::Except(pointers.collect::<Result<_, _>>()?);
        Ok(self)
    }
}

fn pointer_of_text(pointer: &str) -> Result<Pointer, InvalidPointer> {
    Pointer::parse(pointer).ok_or_else(|| InvalidPointer(pointer.to_owned()))
}

/// A text given as an RFC 6901 JSON pointer that is not one: it must be empty, for the whole
/// body, or start with `/`, and every `~` must be followed by `0` or `1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPointer(String);

impl InvalidPointer {
    /// The text that is not a JSON pointer.
    pub fn text(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InvalidPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a JSON pointer (RFC 6901): write \"/member\"",
            self.0
        )
    }
}

impl std::error::Error for InvalidPointer {}

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

    /// `true` for [`typed`](JsonOperation::typed), `false` for [`new`](JsonOperation::new).
    fn hands_over_value(&self) -> bool {
        self.config.hand_over
    }

    fn reply(&self, rejection: &Rejection) -> http::Response<Bytes> {
        crate::problem::reply_under(rejection, self.config.problem_base.as_deref())
    }

    fn head(&self, parts: &Parts) -> Head {
        if !self.config.methods.contains(&parts.method) {
            Head::PassThrough
        } else if !media::is_json_family(&parts.headers) {
            Head::Reject(Rejection::UnsupportedMediaType)
        } else if key_in(&parts.headers).is_some() {
            Head::Guard
        } else if matches!(self.config.key, KeySource::Member(_))
            && !parts.headers.contains_key(&IDEMPOTENCY_KEY)
        {
            // The key is in the body: read once the body is.
            Head::Guard
        } else {
            Head::Reject(Rejection::InvalidKey)
        }
    }

    fn parse<'a>(&self, parts: &'a Parts, body: &Bytes) -> Result<Parsed<'a, T>, Rejection> {
        let header = key_in(&parts.headers);
        if header.is_none() && !matches!(self.config.key, KeySource::Member(_)) {
            return Err(Rejection::InvalidKey);
        }
        let mut document = jcs::parse(body).map_err(|why| Rejection::invalid(why.to_string()))?;
        let value: T = deserialize(body).map_err(Rejection::InvalidRequest)?;
        if let Some(validate) = &self.config.validate {
            validate(&value).map_err(Rejection::InvalidRequest)?;
        }
        let key = match (&self.config.key, header) {
            (KeySource::Header, Some(key)) => key,
            (KeySource::HeaderAndMember(pointer), Some(key)) => match document.get(pointer) {
                Some(Node::String(member)) if *member == *key => key,
                _ => return Err(at(pointer, "must be a string equal to the Idempotency-Key")),
            },
            (KeySource::Member(pointer), header) => {
                let member = match document.get(pointer) {
                    Some(Node::String(member)) if is_key(member.as_bytes()) => member,
                    _ => return Err(at(pointer, KEY_MEMBER)),
                };
                if header.as_ref().is_some_and(|header| *header != **member) {
                    return Err(at(
                        pointer,
                        "must equal the Idempotency-Key header, when sent",
                    ));
                }
                Cow::Owned(member.clone().into_owned())
            }
            (_, None) => return Err(Rejection::InvalidKey),
        };
        let fingerprint = self.fingerprint(parts, &mut document, body.len());
        Ok(Parsed {
            key,
            fingerprint,
            value,
        })
    }
}

/// What a key read from a body member must be.
const KEY_MEMBER: &str =
    "must be a string of 1 to 255 visible ASCII characters: the idempotency key";

/// A refusal about the body member at `pointer`.
fn at(pointer: &Pointer, detail: &'static str) -> Rejection {
    Rejection::InvalidRequest(Invalid::at(pointer.as_str().to_owned(), detail))
}

/// `body` as a `T`, or why not: the member by JSON pointer and what was expected, without
/// the parser's line and column.
fn deserialize<T: DeserializeOwned>(body: &[u8]) -> Result<T, Invalid> {
    // The path is tracked only for a body that fails: a valid one is read once, as fast as
    // serde reads it.
    serde_json::from_slice(body).map_err(|_| why_not::<T>(body))
}

/// Why `body` is not a `T`, read again with the path tracked.
#[cold]
fn why_not<T: DeserializeOwned>(body: &[u8]) -> Invalid {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let error = match serde_path_to_error::deserialize::<_, T>(&mut deserializer) {
        Err(error) => error,
        // serde refused it once; read again, only what follows the value can be wrong (the
        // body was checked to be one JSON value before).
        Ok(_) => return Invalid::new("the body is not one JSON value"),
    };
    {
        let mut pointer = pointer_of(error.path());
        let inner = error.into_inner();
        let mut detail = inner.to_string();
        // serde's message ends with the parser's position: the client is told the member.
        let position = format!(" at line {} column {}", inner.line(), inner.column());
        if let Some(kept) = detail.strip_suffix(&position) {
            detail.truncate(kept.len());
        }
        // A missing member is named in the message, its object in the path.
        if let Some(name) = detail
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            pointer.push('/');
            push_escaped(&mut pointer, name);
        }
        // About the body as a whole (an array where an object was expected), or a place serde
        // could not name: no member to point at.
        if pointer.is_empty() || pointer.contains("/?") {
            return Invalid::new(detail);
        }
        Invalid::at(pointer, detail)
    }
}

/// The RFC 6901 JSON pointer of a path serde walked.
fn pointer_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut pointer = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => {
                pointer.push('/');
                pointer.push_str(&index.to_string());
            }
            Segment::Map { key } => {
                pointer.push('/');
                push_escaped(&mut pointer, key);
            }
            Segment::Enum { variant } => {
                pointer.push('/');
                push_escaped(&mut pointer, variant);
            }
            Segment::Unknown => pointer.push_str("/?"),
        }
    }
    pointer
}

/// `name` as a JSON pointer's reference token: `~` as `~0`, `/` as `~1`.
fn push_escaped(pointer: &mut String, name: &str) {
    for c in name.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
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
