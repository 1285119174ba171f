//! The `Idempotency-Key` header as draft-ietf-httpapi-idempotency-key-header defines it.

use std::borrow::Cow;
use std::fmt;

use http::{HeaderMap, HeaderValue};

use super::IDEMPOTENCY_KEY;

/// The longest key accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// A client's idempotency key, read from one `Idempotency-Key` header: 1 to 255 visible ASCII
/// characters, sent bare (`abc`) or as a Structured Field string (`"abc"`, with `\"` and `\\`
/// escapes). Both forms name the same key. A bare key holds no comma: `a1,a2` can only be two
/// header lines a proxy joined (as `a1, a2` is), so it is refused; quoted, `"a1,a2"` is one
/// key.
///
/// The layer puts the validated key into the request extensions for the inner service,
/// whichever operation guards the request (a key read from a body member too), so a handler
/// that keeps the key beside its own row reads it from there. It is always a key as above: a
/// custom operation's key that is not one (or a label contract's `request_id` over 255
/// characters) is not put there.
///
/// ```
/// use http::Request;
/// use tower_idempotency::operation::IdempotencyKey;
///
/// fn key_of<B>(request: &Request<B>) -> Option<&str> {
///     request.extensions().get::<IdempotencyKey>().map(IdempotencyKey::as_str)
/// }
/// # assert_eq!(key_of(&Request::new(())), None);
/// ```
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// use tower_idempotency::operation::IdempotencyKey;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("idempotency-key", HeaderValue::from_static(r#""8e03978e-40d5""#));
/// let quoted = IdempotencyKey::from_headers(&headers).unwrap();
/// headers.insert("idempotency-key", HeaderValue::from_static("8e03978e-40d5"));
/// let bare = IdempotencyKey::from_headers(&headers).unwrap();
/// assert_eq!(quoted, bare);
/// assert_eq!(bare.as_str(), "8e03978e-40d5");
///
/// headers.insert("idempotency-key", HeaderValue::from_static(r#""a b""#));
/// assert!(IdempotencyKey::from_headers(&headers).is_none(), "a space is not visible ASCII");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(pub(crate) String);

impl IdempotencyKey {
    /// The key of the one `Idempotency-Key` header in `headers`; `None` if there is none, more
    /// than one, or its value is not a valid key.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        key_in(headers).map(|key| Self(key.into_owned()))
    }

    /// The key of one header value, bare or quoted; `None` if it is not a valid key.
    pub fn parse(value: &HeaderValue) -> Option<Self> {
        key_of(value).map(|key| Self(key.into_owned()))
    }

    /// The key as the client meant it (unquoted).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key of the one `Idempotency-Key` header in `headers`, borrowed unless it was quoted.
pub(crate) fn key_in(headers: &HeaderMap) -> Option<Cow<'_, str>> {
    crate::headers::single(headers, &IDEMPOTENCY_KEY).and_then(key_of)
}

/// The head check of an operation keyed by the `Idempotency-Key` header: guard the request if
/// it carries one valid key, refuse it otherwise.
pub(crate) fn keyed_head(parts: &http::request::Parts) -> super::Head {
    if key_in(&parts.headers).is_none() {
        super::Head::Reject(crate::rejection::Rejection::InvalidKey)
    } else {
        super::Head::Guard
    }
}

/// A request keyed by its `Idempotency-Key` header, with `fingerprint`; the key is also the
/// value handed to the inner service.
pub(crate) fn keyed<'a>(
    parts: &'a http::request::Parts,
    fingerprint: super::Fingerprint,
) -> Result<super::Parsed<'a, IdempotencyKey>, crate::rejection::Rejection> {
    let key = key_in(&parts.headers).ok_or(crate::rejection::Rejection::InvalidKey)?;
    Ok(super::Parsed {
        fingerprint,
        value: IdempotencyKey(key.clone().into_owned()),
        key,
    })
}

/// Whether `key` is a valid key: 1 to [`MAX_KEY_LEN`] visible ASCII characters, as a key
/// read from a body member must be too.
pub(crate) fn is_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.iter().all(u8::is_ascii_graphic)
}

/// The key of one header value, borrowed unless it was quoted.
fn key_of(value: &HeaderValue) -> Option<Cow<'_, str>> {
    let bytes = value.as_bytes();
    let key: Cow<'_, [u8]> = match bytes.strip_prefix(b"\"") {
        Some(quoted) => Cow::Owned(unquote(quoted)?),
        // A comma outside quotes joins two field lines.
        None if bytes.contains(&b',') => return None,
        None => Cow::Borrowed(bytes),
    };
    if !is_key(&key) {
        return None;
    }
    // Visible ASCII is valid UTF-8.
    match key {
        Cow::Borrowed(bytes) => std::str::from_utf8(bytes).ok().map(Cow::Borrowed),
        Cow::Owned(bytes) => String::from_utf8(bytes).ok().map(Cow::Owned),
    }
}

/// The content of an sf-string after its opening quote: printable ASCII, `\"` and `\\` the
/// only escapes, the closing quote last.
fn unquote(quoted: &[u8]) -> Option<Vec<u8>> {
    let mut key = Vec::with_capacity(quoted.len());
    let mut bytes = quoted.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(escaped),
                _ => return None,
            },
            b'"' => return bytes.next().is_none().then_some(key),
            b' '..=b'~' => key.push(b),
            _ => return None,
        }
    }
    None // no closing quote
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &[u8]) -> Option<String> {
        IdempotencyKey::parse(&HeaderValue::from_bytes(value).ok()?)
            .map(IdempotencyKey::into_string)
    }

    #[test]
    fn bare_and_quoted_forms() {
        assert_eq!(key(b"abc").as_deref(), Some("abc"));
        assert_eq!(key(b"\"abc\"").as_deref(), Some("abc"));
        assert_eq!(key(br#""a\"b\\c""#).as_deref(), Some(r#"a"b\c"#));
        assert_eq!(key(br#"a"b"#).as_deref(), Some(r#"a"b"#));
        assert_eq!(key(br#""a,b""#).as_deref(), Some("a,b"));
        for bad in [
            &b""[..],
            b"\"\"",
            b"\"abc",
            b"\"abc\"x",
            b"\"a\\x\"",
            b"\"a\\",
            b"a b",
            b"\"a b\"",
            b"\"\xc3\xa9\"",
            b"\xc3\xa9",
            b"a\tb",
            b"a,b",
            b",",
        ] {
            assert_eq!(key(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn length_bounds() {
        let longest = "k".repeat(MAX_KEY_LEN);
        assert_eq!(key(longest.as_bytes()), Some(longest.clone()));
        assert_eq!(
            key(format!("\"{longest}\"").as_bytes()),
            Some(longest.clone())
        );
        assert_eq!(key(format!("{longest}k").as_bytes()), None);
        assert_eq!(key(format!("\"{longest}k\"").as_bytes()), None);
        assert_eq!(key(b"k").as_deref(), Some("k"));
    }

    #[test]
    fn the_key_reads_back_as_sent() {
        let key = IdempotencyKey::parse(&HeaderValue::from_static(r#""a\"b""#)).unwrap();
        assert_eq!(key.as_str(), r#"a"b"#);
        assert_eq!(key.to_string(), r#"a"b"#);
        assert_eq!(key.into_string(), r#"a"b"#);
    }

    #[test]
    fn exactly_one_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&headers), None);
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert!(IdempotencyKey::from_headers(&headers).is_some());
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert_eq!(IdempotencyKey::from_headers(&headers), None);
    }
}
