//! The label contract (`LABEL_CONTRACT.md` in the repository): [`LabelOperation`], its strict validation, its fingerprint, and
//! [`LabelContract`], the [`Operation`] that guards `POST /labels` byte for byte.
//!
//! A client stores a [`LabelOperation`] *before* its first attempt and builds every attempt from
//! it with [`LabelOperation::attempt`], so that every attempt carries the same `Idempotency-Key`
//! and the same body bytes. The server side parses the body with [`LabelOperation::from_json`] and
//! compares intents with [`fingerprint`].
//!
//! ```
//! use tower_idempotency::operation::LabelContract;
//! use tower_idempotency::operation::LabelOperation;
//!
//! let op = LabelOperation::new("label-req-7", "parcel-42");
//! let attempt = op.attempt("/labels").unwrap();
//! assert_eq!(attempt.headers()["idempotency-key"], "label-req-7");
//! assert_eq!(attempt.body(), r#"{"request_id":"label-req-7","parcel_id":"parcel-42"}"#);
//!
//! let parsed = LabelOperation::from_json(br#"{"parcel_id":"parcel-42", "request_id" : "label-req-7"}"#).unwrap();
//! assert_eq!(parsed, op);
//! assert_eq!(
//!     LabelContract::fingerprint(&parsed.request_id, &parsed.parcel_id).to_hex().as_str(),
//!     "9c2dc67e4c22f75bcc63a19e384876bc7f83fd8f117cb45df4aa1ec13e49ae3a",
//! );
//! ```

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod reader;
mod shared_str;

use self::reader::Fields;
pub use self::shared_str::SharedStr;
use super::media;
use super::{Fingerprint, Head, IDEMPOTENCY_KEY, Operation, Parsed};
use crate::rejection;
use crate::rejection::Rejection;

/// One create operation: the intent (`request_id`) and the object it acts on (`parcel_id`).
///
/// Its JSON form is exactly `{"request_id":"…","parcel_id":"…"}`. `request_id` names the
/// operation, not the parcel: two different `request_id`s with the same `parcel_id` are two
/// operations, not a retry.
///
/// On the server side, with
/// [`value_extension(true)`](crate::IdempotencyLayer::value_extension) on the layer, the
/// validated operation goes into the request extensions, so the inner service can read it
/// without parsing the body again (`Extension<LabelOperation>` in axum); without it the
/// inner service reads the body (`Json<LabelOperation>`).
///
/// ```
/// use tower_idempotency::operation::LabelOperation;
///
/// let op = LabelOperation::new("label-req-7", "parcel-42");
/// assert_eq!(
///     serde_json::to_string(&op).unwrap(),
///     r#"{"request_id":"label-req-7","parcel_id":"parcel-42"}"#,
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelOperation {
    /// The operation's identity; also the value of every attempt's `Idempotency-Key`.
    pub request_id: SharedStr,
    /// The parcel the label is created for.
    pub parcel_id: SharedStr,
}

/// The body or key of a request is not a valid operation (`LABEL_CONTRACT.md` §2, steps 5 and 6).
///
/// ```
/// use tower_idempotency::operation::LabelOperation;
///
/// assert!(LabelOperation::from_json(br#"{"request_id":"","parcel_id":"p"}"#).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidOperation(());

impl fmt::Display for InvalidOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid label operation")
    }
}

impl std::error::Error for InvalidOperation {}

impl LabelOperation {
    /// Creates an operation from its two identifiers.
    ///
    /// No validation happens here; a server validates with [`LabelOperation::from_json`].
    ///
    /// ```
    /// use tower_idempotency::operation::LabelOperation;
    ///
    /// let op = LabelOperation::new("label-req-7", "parcel-42");
    /// assert_eq!(op.request_id, "label-req-7");
    /// ```
    pub fn new(request_id: impl Into<SharedStr>, parcel_id: impl Into<SharedStr>) -> Self {
        Self {
            request_id: request_id.into(),
            parcel_id: parcel_id.into(),
        }
    }

    /// Parses and validates a request body strictly.
    ///
    /// The body must be exactly one JSON object with exactly the fields `request_id` and
    /// `parcel_id`, each a non-empty string of `[A-Za-z0-9_-]`, followed by nothing but
    /// whitespace.
    ///
    /// # Errors
    ///
    /// [`InvalidOperation`] for anything else: a missing or extra field, `null`, a number, a
    /// boolean, an empty string, a character outside the alphabet, a second JSON value.
    ///
    /// ```
    /// use tower_idempotency::operation::LabelOperation;
    ///
    /// assert!(LabelOperation::from_json(br#"{"request_id":"a","parcel_id":"b"}"#).is_ok());
    /// assert!(LabelOperation::from_json(br#"{"request_id":"a","parcel_id":"b","x":1}"#).is_err());
    /// assert!(LabelOperation::from_json(br#"{"request_id":"a","parcel_id":"b"} {}"#).is_err());
    /// assert!(LabelOperation::from_json(br#"{"request_id":"a b","parcel_id":"b"}"#).is_err());
    /// ```
    pub fn from_json(body: &[u8]) -> Result<Self, InvalidOperation> {
        let fields = Fields::parse(body)?;
        Ok(Self::new(
            fields.request_id.as_ref(),
            fields.parcel_id.as_ref(),
        ))
    }

    /// Parses and validates a request body strictly, as [`from_json`](Self::from_json) does;
    /// the fields share the body's bytes instead of copying them.
    ///
    /// # Errors
    ///
    /// [`InvalidOperation`], as [`from_json`](Self::from_json).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_idempotency::operation::LabelOperation;
    ///
    /// let body = Bytes::from_static(br#"{"request_id":"a","parcel_id":"b"}"#);
    /// assert_eq!(LabelOperation::from_body(&body).unwrap(), LabelOperation::new("a", "b"));
    /// ```
    pub fn from_body(body: &Bytes) -> Result<Self, InvalidOperation> {
        Fields::parse(body).map(|fields| Self::within(body, fields))
    }

    /// The operation of `fields`, parsed from `body`, sharing its bytes.
    fn within(body: &Bytes, fields: Fields<'_>) -> Self {
        Self {
            request_id: SharedStr::within(body, fields.request_id),
            parcel_id: SharedStr::within(body, fields.parcel_id),
        }
    }

    /// The fingerprint of this operation; see [`LabelContract::fingerprint`].
    ///
    /// ```
    /// use tower_idempotency::operation::LabelContract;
    /// use tower_idempotency::operation::LabelOperation;
    ///
    /// let op = LabelOperation::new("a", "b");
    /// assert_eq!(op.fingerprint(), LabelContract::fingerprint("a", "b"));
    /// ```
    pub fn fingerprint(&self) -> Fingerprint {
        LabelContract::fingerprint(&self.request_id, &self.parcel_id)
    }

    /// The JSON body of every attempt: `{"request_id":"…","parcel_id":"…"}`.
    ///
    /// ```
    /// use tower_idempotency::operation::LabelOperation;
    ///
    /// assert_eq!(
    ///     LabelOperation::new("r", "p").to_json(),
    ///     r#"{"request_id":"r","parcel_id":"p"}"#,
    /// );
    /// ```
    pub fn to_json(&self) -> String {
        // Serialising two strings into a string cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Builds one attempt of this operation: `POST uri`, `Content-Type: application/json`,
    /// `Idempotency-Key: <request_id>` and the JSON body.
    ///
    /// Every call with the same operation gives the same header and the same body bytes: the key
    /// is bound to the intent, not to the delivery.
    ///
    /// # Errors
    ///
    /// An [`http::Error`] if `uri` is not a valid URI or `request_id` is not a valid header
    /// value.
    ///
    /// ```
    /// use tower_idempotency::operation::LabelOperation;
    ///
    /// let op = LabelOperation::new("label-req-7", "parcel-42");
    /// let first = op.attempt("http://127.0.0.1:3000/labels").unwrap();
    /// let second = op.attempt("http://127.0.0.1:3000/labels").unwrap();
    /// assert_eq!(first.method(), "POST");
    /// assert_eq!(first.headers()["content-type"], "application/json");
    /// assert_eq!(first.headers(), second.headers());
    /// assert_eq!(first.body(), second.body());
    /// ```
    pub fn attempt<U>(&self, uri: U) -> Result<Request<String>, http::Error>
    where
        Uri: TryFrom<U>,
        <Uri as TryFrom<U>>::Error: Into<http::Error>,
    {
        let key = HeaderValue::try_from(self.request_id.as_str())?;
        Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
            .header(IDEMPOTENCY_KEY, key)
            .body(self.to_json())
    }
}

/// The label contract (`LABEL_CONTRACT.md` in the repository) as an [`Operation`]: `POST /labels` with exactly
/// `{"request_id":"…","parcel_id":"…"}` and `Idempotency-Key` equal to `request_id`, every
/// refusal `{"error":"…"}` byte for byte. The worked example of a strict operation.
///
/// Path `/labels`, body limit 4096 bytes. The contract has one key space: its layer takes
/// [`global_keys`](crate::IdempotencyLayer::global_keys). The inner service gets the body,
/// and the [`LabelOperation`] in the request extensions too when the layer says
/// [`value_extension(true)`](crate::IdempotencyLayer::value_extension).
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency::operation::LabelContract;
/// use tower_idempotency::layer::RequestBody;
/// use tower_idempotency::operation::LabelOperation;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let create = service_fn(|request: Request<RequestBody<String>>| async move {
///     let op = request.extensions().get::<LabelOperation>().unwrap();
///     let body = format!(r#"{{"request_id":"{}","state":"created"}}"#, op.request_id);
///     Ok::<_, Infallible>(Response::builder().status(StatusCode::CREATED).body(body).unwrap())
/// });
/// let service = ServiceBuilder::new()
///     .layer(
///         IdempotencyLayer::new(MemoryStore::new(), LabelContract)
///             .global_keys()
///             .value_extension(true),
///     )
///     .service(create);
///
/// // The client stores the operation, then builds every attempt from it.
/// let op = LabelOperation::new("label-req-7", "parcel-42");
/// let first = service.clone().oneshot(op.attempt("/labels").unwrap()).await.unwrap();
/// let retry = service.clone().oneshot(op.attempt("/labels").unwrap()).await.unwrap();
/// assert_eq!((first.status(), retry.status()), (StatusCode::CREATED, StatusCode::CREATED));
///
/// let other = LabelOperation::new("label-req-7", "parcel-43");
/// let conflict = service.oneshot(other.attempt("/labels").unwrap()).await.unwrap();
/// assert_eq!(conflict.status(), StatusCode::CONFLICT);
/// # }
/// ```
///
/// Its replies, in the order the checks run:
///
#[doc = include_str!("../../reply/label.md")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LabelContract;

impl LabelContract {
    /// `sha256(request_id + "\n" + parcel_id)`: the contract's fingerprint (`LABEL_CONTRACT.md` §3), shown as its 64
    /// lowercase hexadecimal digits ([`Fingerprint::to_hex`], `Display`).
    ///
    /// It is computed from validated field values, not from the raw body, so field order and
    /// whitespace do not change it. It compares intents; it proves nothing about who sent them.
    ///
    /// ```
    /// use tower_idempotency::operation::LabelContract;
    ///
    /// assert_eq!(
    ///     LabelContract::fingerprint("label-req-7", "parcel-42").to_hex().as_str(),
    ///     "9c2dc67e4c22f75bcc63a19e384876bc7f83fd8f117cb45df4aa1ec13e49ae3a",
    /// );
    /// ```
    pub fn fingerprint(request_id: &str, parcel_id: &str) -> Fingerprint {
        let digest = Sha256::new()
            .chain_update(request_id.as_bytes())
            .chain_update(b"\n")
            .chain_update(parcel_id.as_bytes())
            .finalize();
        Fingerprint::from_sha256(digest.into())
    }
}

impl Operation for LabelContract {
    type Value = LabelOperation;

    fn head(&self, parts: &Parts) -> Head {
        if parts.method != Method::POST {
            Head::Reject(Rejection::MethodNotAllowed)
        } else if !media::is_json(&parts.headers) {
            Head::Reject(Rejection::UnsupportedMediaType)
        } else {
            Head::Guard
        }
    }

    fn parse<'a>(
        &self,
        parts: &'a Parts,
        body: &Bytes,
    ) -> Result<Parsed<'a, LabelOperation>, Rejection> {
        // Checked and fingerprinted on the parsed fields, before they become the value.
        let fields = Fields::parse(body).map_err(|_| Rejection::invalid(""))?;
        let key = matching_key(&parts.headers, &fields.request_id).ok_or(Rejection::InvalidKey)?;
        Ok(Parsed {
            key: Cow::Borrowed(key),
            fingerprint: LabelContract::fingerprint(&fields.request_id, &fields.parcel_id),
            value: LabelOperation::within(body, fields),
        })
    }

    /// The crate's refusal table's row as `{"error":"<code>"}`, with three
    /// differences the contract makes: any bad key or body is `invalid_request`, a reused key
    /// is `409` (the contract's status for both of its conflicts), and only a refusal of
    /// admission or the store carries `Retry-After` (a pending key does not). A `405` names
    /// the method allowed.
    fn reply(&self, rejection: &Rejection) -> Response<Bytes> {
        let declared = match rejection {
            Rejection::InvalidKey => &rejection::INVALID_REQUEST,
            // The contract has one answer for a store that failed it: `store_unavailable`.
            Rejection::OutcomeUnknown => &rejection::STORE_UNAVAILABLE,
            other => other.declared(),
        };
        let status = match rejection {
            Rejection::Conflict => StatusCode::CONFLICT,
            _ => declared.status,
        };
        let mut response = Response::new(Bytes::from_static(declared.error));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Rejection::MethodNotAllowed = rejection {
            headers.insert(header::ALLOW, HeaderValue::from_static("POST"));
        }
        if declared.retry == rejection::Retry::Refused {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
        }
        response
    }

    fn default_path(&self) -> Option<&'static str> {
        Some("/labels")
    }

    fn default_body_limit(&self) -> usize {
        4096
    }

    /// The contract fixes its answers' headers: no window is advertised unless the layer
    /// asks.
    fn advertises_window(&self) -> bool {
        false
    }

    /// The contract knows no expired key: past its replay window a key is new, whatever
    /// the store remembers, unless the layer asks.
    fn answers_expired(&self) -> bool {
        false
    }
}

/// Label contract §2 step 6: exactly one `Idempotency-Key` header, equal to `request_id`; the key,
/// borrowed from the header.
fn matching_key<'a>(headers: &'a HeaderMap, request_id: &str) -> Option<&'a str> {
    crate::headers::single(headers, &IDEMPOTENCY_KEY)
        .filter(|key| key.as_bytes() == request_id.as_bytes())
        .and_then(|key| key.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::reader::is_identifier_byte;
    use super::*;

    const BODIES: [&[u8]; 10] = [
        br#"{"request_id":"label-req-7","parcel_id":"parcel-42"}"#,
        br#"{ "parcel_id" : "p", "request_id" : "r" }  "#,
        br#"{"request_id":"\u0061b","parcel_id":"c\u002dd"}"#,
        br#"{"request_id":"a","parcel_id":"b","x":1}"#,
        br#"{"request_id":"a","request_id":"b","parcel_id":"c"}"#,
        br#"{"request_id":"","parcel_id":"b"}"#,
        br#"{"request_id":"a b","parcel_id":"b"}"#,
        br#"{"request_id":null,"parcel_id":"b"}"#,
        br#"{"request_id":"a","parcel_id":"b"} {}"#,
        br#"{"request_id":"\u00e9","parcel_id":"b"}"#,
    ];

    /// The contract read with serde alone: an object of the two fields, each a non-empty
    /// string of `[A-Za-z0-9_-]` (checked here without the crate's table). The answer
    /// [`Fields::plain`] must agree with.
    fn by_serde(body: &[u8]) -> Option<(String, String)> {
        let identifier = |text: &str| {
            !text.is_empty()
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        // JSON's own whitespace, which a form feed is not (`trim_ascii_start` would take it).
        let first = body
            .iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
        if first != Some(&b'{') {
            return None;
        }
        let fields: Fields<'_> = serde_json::from_slice(body).ok()?;
        (identifier(&fields.request_id) && identifier(&fields.parcel_id)).then(|| {
            (
                fields.request_id.into_owned(),
                fields.parcel_id.into_owned(),
            )
        })
    }

    /// The crate's reading of a body, as the layer makes it (the fields shared with the body
    /// where they can be).
    fn by_parse(body: &[u8]) -> Option<(String, String)> {
        LabelOperation::from_body(&Bytes::copy_from_slice(body))
            .ok()
            .map(|op| (op.request_id.into(), op.parcel_id.into()))
    }

    #[test]
    fn the_identifier_table_is_the_alphabet() {
        for byte in 0..=u8::MAX {
            let expected = byte.is_ascii_lowercase()
                || byte.is_ascii_uppercase()
                || byte.is_ascii_digit()
                || byte == b'_'
                || byte == b'-';
            assert_eq!(is_identifier_byte(byte), expected, "{byte:#04x}");
        }
    }

    #[test]
    fn the_bodies_clients_send_are_read_without_serde() {
        for (body, request_id, parcel_id) in [
            (BODIES[0], "label-req-7", "parcel-42"),
            (BODIES[1], "r", "p"),
            (
                &b"\r\n\t {\n\t\"request_id\"\t:\r\"A_9-z\"\n,\"parcel_id\":\"0\"}\n"[..],
                "A_9-z",
                "0",
            ),
        ] {
            let fields = Fields::plain(body).expect("a plain body");
            assert_eq!(fields.request_id, Cow::Borrowed(request_id));
            assert_eq!(fields.parcel_id, Cow::Borrowed(parcel_id));
        }
        // Read by serde instead: escapes, extra or repeated fields, other values, trailing
        // values, whitespace JSON does not have.
        for body in [
            BODIES[2],
            BODIES[3],
            BODIES[4],
            BODIES[5],
            BODIES[6],
            BODIES[7],
            BODIES[8],
            BODIES[9],
            br#"{"request_id":"a"}"#,
            br#"{"request_id":"a","request_id":"b"}"#,
            br#"{"request_id":"a","parcel_id":"b",}"#,
            br#"{"request_id":"a""parcel_id":"b"}"#,
            br#"{"request_id""a","parcel_id":"b"}"#,
            br#"["request_id","a","parcel_id","b"]"#,
            br#"{"request_id":"a","parcel_id":"b""#,
            br#"{"request_id":"a","parcel_id":"b"}x"#,
            b"\x0c{\"request_id\":\"a\",\"parcel_id\":\"b\"}",
            br#"{"request_id":"a","parcel_id":"b
"}"#,
            b"{\"request_id\":\"a\",\"parcel_id\":\"\xff\"}",
        ] {
            assert!(
                Fields::plain(body).is_none(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(1024))]
        /// Plain bodies, and each with one fault (a name, a value, a separator, an extra or
        /// missing member, what comes before or after): read with the plain reader first,
        /// every one is accepted or refused as serde alone does, with the same fields.
        #[test]
        fn the_plain_reader_agrees_with_serde(
            spaces in proptest::collection::vec(
                proptest::sample::select(vec!["", " ", "\t", "\n", "\r\n"]),
                8,
            ),
            values in proptest::collection::vec("[A-Za-z0-9_-]{1,12}", 2),
            parcel_first in proptest::bool::ANY,
            at in 0..2usize,
            fault in proptest::sample::select(vec![
                "", "", "", "", "", "", "", "",
                "name:request\\u005fid", "name:x", "name:", "name:Request_id", "name:parcel_id ",
                "name:request_idx", "name:parcel", "name: request_id", "value:\" a\"",
                "value:\"a \"", "value:\"a\u{0}\"", "value:\"a\tb\"", "tail:\x0c", "tail:\x0b",
                "sep:\x0c,", "sep:,\u{a0}", "close:\x0b}", "lead:\u{feff}", "array",
                "value:\"\"", "value:\"a b\"", "value:\"a\\\\b\"", "value:\"\\u0061\"",
                "value:1", "value:null", "value:\"\u{e9}\"", "value:\"a", "value:a",
                "extra", "repeat", "drop", "sep:,,", "sep:;", "sep:", "tail:{}", "tail:x",
                "tail:,", "lead:\x0c", "lead:\u{a0}", "close:,}", "close:",
            ]),
        ) {
            let mut members = vec![
                ("request_id".to_owned(), format!("\"{}\"", values[0])),
                ("parcel_id".to_owned(), format!("\"{}\"", values[1])),
            ];
            if parcel_first {
                members.swap(0, 1);
            }
            let (mut separator, mut lead, mut tail, mut close) = (",", "", "", "}");
            match fault.split_once(':') {
                Some(("name", name)) => members[at].0 = name.to_owned(),
                Some(("value", value)) => members[at].1 = value.to_owned(),
                Some(("sep", text)) => separator = text,
                Some(("tail", text)) => tail = text,
                Some(("lead", text)) => lead = text,
                Some(("close", text)) => close = text,
                _ => match fault {
                    "extra" => members.insert(at, ("x".to_owned(), "1".to_owned())),
                    "repeat" => members.push(members[at].clone()),
                    "drop" => {
                        members.remove(at);
                    }
                    _ => {}
                },
            }
            let inner: Vec<String> = members
                .iter()
                .enumerate()
                .map(|(i, (name, value))| {
                    let space = |k: usize| spaces[(i * 3 + k) % spaces.len()];
                    format!("{}\"{name}\"{}:{}{value}", space(0), space(1), space(2))
                })
                .collect();
            let body = if fault == "array" {
                let values: Vec<&str> = members.iter().map(|(_, value)| value.as_str()).collect();
                format!("{}[{}]", spaces[6], values.join(separator))
            } else {
                format!(
                    "{lead}{}{{{}{}{close}{}{tail}",
                    spaces[6],
                    inner.join(separator),
                    spaces[7],
                    spaces[5],
                )
            };
            let parsed = by_parse(body.as_bytes());
            if fault.is_empty() {
                proptest::prop_assert!(Fields::plain(body.as_bytes()).is_some(), "{}", body);
            }
            proptest::prop_assert_eq!(parsed, by_serde(body.as_bytes()), "{}", body);
        }
    }

    #[test]
    fn from_body_accepts_and_refuses_what_from_json_does() {
        for body in BODIES {
            let shared = Bytes::from_static(body);
            assert_eq!(
                LabelOperation::from_body(&shared),
                LabelOperation::from_json(body),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(
            LabelOperation::from_body(&Bytes::from_static(BODIES[2])),
            Ok(LabelOperation::new("ab", "c-d")),
            "escapes are decoded"
        );
    }

    #[test]
    fn fields_without_escapes_share_the_body() {
        let body = Bytes::from_static(BODIES[0]);
        let op = LabelOperation::from_body(&body).unwrap();
        let range = body.as_ptr_range();
        for field in [&op.request_id, &op.parcel_id] {
            assert!(range.contains(&field.as_ptr()), "{field:?} is a copy");
        }
        assert_eq!(op, LabelOperation::new("label-req-7", "parcel-42"));
    }
}
