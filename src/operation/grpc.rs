//! [`GrpcOperation`]: unary gRPC calls of the methods it guards.

use std::borrow::Cow;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Method, Response, StatusCode, header};

use super::key::{keyed, keyed_head};
use super::{Fingerprint, Head, IdempotencyKey, Operation, Parsed, media};
use crate::rejection;
use crate::rejection::Rejection;

/// The content type of a gRPC call, with or without a `+proto`-style suffix.
const GRPC: &str = "application/grpc";

/// Unary gRPC calls of the methods it guards, named as `/package.Service/Method`, each keyed by
/// its `idempotency-key` metadata entry. A guarded method's path reached other than as a gRPC
/// `POST` is refused with `UNIMPLEMENTED`, since a gRPC server routes by path alone. The body
/// limit defaults to one 4 MiB message, as tonic's. The fingerprint is SHA-256 over the
/// method's path and the request message exactly as framed: one length-prefixed message, its
/// compressed flag included. Every other path, and every call that is not gRPC, passes through
/// untouched: streaming methods and services such as `grpc.health.v1.Health` are simply not
/// guarded.
///
/// Refusals are gRPC statuses, never HTTP errors: HTTP 200, a trailers-only reply whose
/// `grpc-status` and `grpc-message` name the case in the contract's words, for each
/// [`Rejection`]:
///
#[doc = include_str!("../reply/grpc.md")]
///
/// A response over the [cap](crate::IdempotencyLayer::response_limit), 1 MiB by default, is
/// given whole, but its record keeps no body and no trailers, as
/// [`StoredResponses`](crate::layer::StoredResponses#a-response-over-the-cap) describes: its replay
/// has no `grpc-status`, which a gRPC client reads as a call that broke off. Set the cap above
/// the largest message the service answers; tonic decodes at most 4 MiB by default.
///
/// A gRPC error is an HTTP 200 whose status is in its trailers, so
/// [`StoredResponses::Successful`](crate::layer::StoredResponses::Successful) stores it as a success:
/// keep the default, which stores every answer, or release a failed create yourself.
///
/// The created response is the message and its trailers, `grpc-status` included. It is stored
/// before it is written and replayed exactly, a non-OK status as any other. Exactly means as
/// the first call got it: a server that compresses its responses, as with tonic's
/// `send_compressed`, replays the first caller's compressed reply to a retry that may not
/// accept that encoding, so compress replies of guarded methods only where every client accepts
/// it. Put the layer inside tonic-web's `GrpcWebLayer`, so that gRPC-web calls reach it as
/// gRPC. The inner service gets the [`IdempotencyKey`] in the request extensions.
///
/// ```
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// use tower_idempotency::operation::GrpcOperation;
///
/// let operation = GrpcOperation::new().method("/labels.v1.Labels/CreateLabel");
/// let layer = IdempotencyLayer::new(MemoryStore::new(), operation).global_keys();
/// # drop(layer);
/// ```
#[derive(Clone, Default)]
pub struct GrpcOperation {
    methods: Arc<[String]>,
    validate: Option<Arc<Validate>>,
}

/// A check of a call, as [`GrpcOperation::validate`] takes it.
type Validate = dyn Fn(&GrpcCall<'_>) -> Result<(), Cow<'static, str>> + Send + Sync;

/// A guarded unary call as [`GrpcOperation::validate`] sees it: its key, its request message
/// and its head.
#[derive(Debug)]
pub struct GrpcCall<'a> {
    key: &'a str,
    message: &'a [u8],
    compressed: bool,
    parts: &'a Parts,
}

impl<'a> GrpcCall<'a> {
    /// The call's idempotency key, as the client meant it.
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The request message's bytes, without the frame's five-byte prefix, as sent: compressed
    /// with the `grpc-encoding` of the call if [`is_compressed`](Self::is_compressed).
    pub fn message(&self) -> &'a [u8] {
        self.message
    }

    /// Whether the frame's compressed flag is set.
    pub fn is_compressed(&self) -> bool {
        self.compressed
    }

    /// The request's head: its path and its metadata, such as `grpc-encoding`.
    pub fn parts(&self) -> &'a Parts {
        self.parts
    }
}

impl fmt::Debug for GrpcOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcOperation")
            .field("methods", &self.methods)
            .field("validate", &self.validate.is_some())
            .finish()
    }
}

impl GrpcOperation {
    /// Guards no method yet: add each unary create with [`method`](Self::method).
    pub fn new() -> Self {
        Self::default()
    }

    /// Guards the unary method at `path`, written `/package.Service/Method`.
    pub fn method(self, path: impl Into<String>) -> Self {
        let mut methods = self.methods.to_vec();
        methods.push(path.into());
        Self {
            methods: methods.into(),
            validate: self.validate,
        }
    }

    /// Checks each guarded call's key, request message and head before anything is claimed: an
    /// `Err` refuses the call with `INVALID_ARGUMENT`, message `invalid_request`, and it
    /// reaches neither the store nor the service; so does a check that panics. Decode the
    /// message with the service's own types to check its fields, or that the key names the
    /// operation; a compressed message comes as it was sent, to decompress or refuse.
    ///
    /// ```
    /// use tower_idempotency::operation::GrpcOperation;
    /// use tower_idempotency::operation::GrpcCall;
    ///
    /// // The key must be the message's first bytes: a stand-in for decoding it.
    /// let operation = GrpcOperation::new()
    ///     .method("/labels.v1.Labels/CreateLabel")
    ///     .validate(|call: &GrpcCall<'_>| {
    ///         if call.is_compressed() {
    ///             return Err("compressed messages are not accepted");
    ///         }
    ///         if call.message().starts_with(call.key().as_bytes()) {
    ///             Ok(())
    ///         } else {
    ///             Err("the key is not the message's")
    ///         }
    ///     });
    /// # drop(operation);
    /// ```
    pub fn validate<F, E>(self, check: F) -> Self
    where
        F: Fn(&GrpcCall<'_>) -> Result<(), E> + Send + Sync + 'static,
        E: Into<Cow<'static, str>>,
    {
        let check: Arc<Validate> =
            Arc::new(move |call: &GrpcCall<'_>| check(call).map_err(Into::into));
        Self {
            validate: Some(check),
            ..self
        }
    }
}

/// Whether the request's content type is gRPC's: `application/grpc` or `application/grpc+…`.
fn is_grpc(parts: &Parts) -> bool {
    media::media_type(&parts.headers).is_some_and(|media| {
        media.eq_ignore_ascii_case(GRPC)
            || media
                .get(..GRPC.len() + 1)
                .is_some_and(|start| start.eq_ignore_ascii_case("application/grpc+"))
    })
}

/// The one message of a unary call's body: a compressed flag of 0 or 1, a length as a
/// big-endian u32, and exactly that many bytes.
fn one_message(body: &[u8]) -> Option<&[u8]> {
    let (&flag, rest) = body.split_first()?;
    let (length, message) = rest.split_first_chunk::<4>()?;
    (flag <= 1 && u32::from_be_bytes(*length) as usize == message.len()).then_some(message)
}

impl Operation for GrpcOperation {
    type Value = IdempotencyKey;

    fn head(&self, parts: &Parts) -> Head {
        let path = parts.uri.path();
        if !self.methods.iter().any(|method| method == path) {
            return Head::PassThrough;
        }
        // A guarded method is reached only as a gRPC call: a server routes by path alone, so
        // anything else would run the create unguarded.
        if parts.method != Method::POST {
            return Head::Reject(Rejection::MethodNotAllowed);
        }
        if !is_grpc(parts) {
            return Head::Reject(Rejection::UnsupportedMediaType);
        }
        keyed_head(parts)
    }

    fn parse<'a>(
        &self,
        parts: &'a Parts,
        body: &Bytes,
    ) -> Result<Parsed<'a, IdempotencyKey>, Rejection> {
        let message =
            one_message(body).ok_or_else(|| Rejection::invalid("not one gRPC message"))?;
        // The framed message: its compressed flag, its length and its bytes.
        let parsed = keyed(
            parts,
            Fingerprint::digest([parts.uri.path().as_bytes(), &body[..]]),
        )?;
        if let Some(validate) = &self.validate {
            let call = GrpcCall {
                key: &parsed.key,
                message,
                compressed: body.first() == Some(&1),
                parts,
            };
            // A check that panics refuses the call: nothing is claimed yet.
            match panic::catch_unwind(AssertUnwindSafe(|| validate(&call))) {
                Ok(Ok(())) => {}
                Ok(Err(detail)) => return Err(Rejection::invalid(detail)),
                Err(_) => {
                    tracing::error!("the gRPC validation panicked; the call is refused");
                    return Err(Rejection::invalid("the message could not be validated"));
                }
            }
        }
        Ok(parsed)
    }

    /// 4 MiB, tonic's default for a decoded message.
    fn default_body_limit(&self) -> usize {
        4 * 1024 * 1024 + 5
    }

    fn reply(&self, rejection: &Rejection) -> Response<Bytes> {
        let (status, message) = grpc_status(rejection);
        let mut response = Response::new(Bytes::new());
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(GRPC));
        headers.insert("grpc-status", status.header());
        headers.insert("grpc-message", HeaderValue::from_static(message));
        response
    }
}

/// The gRPC status codes a refusal is answered with: those of the canonical codes the layer
/// uses, written as the decimal number `grpc-status` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Code {
    InvalidArgument = 3,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
}

impl Code {
    /// The code as `grpc-status` carries it, without an allocation.
    fn header(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Self::InvalidArgument => "3",
            Self::PermissionDenied => "7",
            Self::ResourceExhausted => "8",
            Self::FailedPrecondition => "9",
            Self::Aborted => "10",
            Self::Unimplemented => "12",
            Self::Internal => "13",
            Self::Unavailable => "14",
        })
    }
}

/// The gRPC status code and message of a refusal: its row of the
/// [refusal table](crate::rejection), the code read off the row's HTTP status, and any bad key or
/// body `invalid_request`, since the key travels in metadata, beside the message.
fn grpc_status(rejection: &Rejection) -> (Code, &'static str) {
    let declared = match rejection {
        Rejection::InvalidKey => &rejection::INVALID_REQUEST,
        // Final, unlike a pending key's `409` (`ABORTED`, which clients retry): the operation
        // may have happened, and no retry can succeed.
        Rejection::KeyExpired(_) => return (Code::FailedPrecondition, rejection::KEY_EXPIRED.code),
        other => other.declared(),
    };
    (code_of(declared.status), declared.code)
}

/// The gRPC code of a refusal of `status`: the codes of HTTP's meanings, and for a status the
/// crate does not refuse with yet, the client's to fix or the server's.
fn code_of(status: StatusCode) -> Code {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
        StatusCode::BAD_REQUEST => Code::InvalidArgument,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::UNPROCESSABLE_ENTITY => Code::FailedPrecondition,
        StatusCode::CONFLICT => Code::Aborted,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        // Not found, method not allowed, unsupported media type: no such method here.
        StatusCode::NOT_FOUND
        | StatusCode::METHOD_NOT_ALLOWED
        | StatusCode::UNSUPPORTED_MEDIA_TYPE => Code::Unimplemented,
        // A refusal of another status: the client's to fix, or the server's.
        status if status.is_client_error() => Code::FailedPrecondition,
        _ => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unary_body_is_exactly_one_framed_message() {
        assert_eq!(one_message(&[0, 0, 0, 0, 2, 8, 1]), Some(&[8u8, 1][..]));
        assert_eq!(
            one_message(&[1, 0, 0, 0, 0]),
            Some(&[][..]),
            "compressed, empty"
        );
        for body in [
            &[][..],
            &[0, 0, 0, 0][..],
            &[2, 0, 0, 0, 0][..],
            &[0, 0, 0, 0, 2, 8][..],
            &[0, 0, 0, 0, 1, 8, 1][..],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..],
        ] {
            assert_eq!(one_message(body), None, "{body:?}");
        }
    }

    #[test]
    fn every_refusal_is_a_grpc_status_in_an_http_200() {
        for rejection in Rejection::every() {
            let response = GrpcOperation::new().reply(&rejection);
            assert_eq!(response.status(), StatusCode::OK, "{rejection:?}");
            assert_eq!(response.headers()[header::CONTENT_TYPE], GRPC);
            assert!(response.body().is_empty(), "trailers-only: {rejection:?}");
            let status = response.headers()["grpc-status"].to_str().unwrap();
            assert_ne!(status, "0", "{rejection:?} is not OK");
        }
        // The header is each code's number.
        for code in [
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
        ] {
            assert_eq!(code.header(), (code as u8).to_string(), "{code:?}");
        }
        // A refusal of a status none has yet: the client's to fix, or the server's, never
        // "no such method".
        assert_eq!(code_of(StatusCode::GONE), Code::FailedPrecondition);
        assert_eq!(code_of(StatusCode::BAD_GATEWAY), Code::Internal);
        // Every refusal's code and message, as the header carries them.
        let table: Vec<_> = Rejection::every()
            .iter()
            .map(|rejection| {
                let response = GrpcOperation::new().reply(rejection);
                let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
                (header("grpc-status"), header("grpc-message"))
            })
            .collect();
        let expected = [
            ("12", "not_found"),
            ("12", "method_not_allowed"),
            ("12", "unsupported_media_type"),
            ("8", "payload_too_large"),
            ("3", "invalid_request"),
            ("3", "invalid_request"),
            ("7", "scope_required"),
            ("9", "idempotency_conflict"),
            ("10", "request_pending"),
            ("8", "not_admitted"),
            ("14", "not_admitted"),
            ("14", "store_unavailable"),
            ("13", "create_failed"),
            ("13", "response_too_large"),
            ("14", "outcome_unknown"),
            ("9", "key_expired"),
        ];
        let expected: Vec<_> = expected
            .iter()
            .map(|(code, message)| ((*code).to_owned(), (*message).to_owned()))
            .collect();
        assert_eq!(table, expected);
    }
}
