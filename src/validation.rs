//! The checks of contract §2 that look at the request itself: content type, declared length,
//! the limited body read, and the `Idempotency-Key` header.

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http_body::Body;
use http_body_util::BodyExt;

use crate::operation::IDEMPOTENCY_KEY;

/// Step 3: the `Content-Type` media type is `application/json`, compared case-insensitively,
/// parameters allowed; missing or unparsable fails.
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(CONTENT_TYPE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let (media_type, mut parameters) = match value.split_once(';') {
        Some((media_type, parameters)) => (media_type, Some(parameters)),
        None => (value, None),
    };
    if !media_type.trim().eq_ignore_ascii_case("application/json") {
        return false;
    }
    while let Some(rest) = parameters {
        match parse_parameter(rest) {
            Some(next) => parameters = next,
            None => return false,
        }
    }
    true
}

/// Parses one `name=value` parameter (value a token or a quoted string) at the start of
/// `text`; returns what follows the next `;`, or `None` inside `Some` at the end.
#[allow(clippy::option_option)]
fn parse_parameter(text: &str) -> Option<Option<&str>> {
    let text = text.trim_start_matches([' ', '\t']);
    if text.is_empty() {
        return Some(None); // a trailing `;` is ignored
    }
    let (name, rest) = text.split_once('=')?;
    if name.is_empty() || !name.bytes().all(is_token) {
        return None;
    }
    let rest = if let Some(quoted) = rest.strip_prefix('"') {
        let mut escaped = false;
        let mut end = None;
        for (i, b) in quoted.bytes().enumerate() {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        &quoted[end? + 1..]
    } else {
        let len = rest.bytes().take_while(|&b| is_token(b)).count();
        if len == 0 {
            return None;
        }
        &rest[len..]
    };
    let rest = rest.trim_start_matches([' ', '\t']);
    if rest.is_empty() {
        Some(None)
    } else {
        rest.strip_prefix(';').map(Some)
    }
}

/// An RFC 9110 token character.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Step 4, at once: a declared `Content-Length` over the limit.
pub(crate) fn declares_over(headers: &HeaderMap, limit: usize) -> bool {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|len| len > limit as u64)
}

/// Why reading a body at most `limit` long failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// More than `limit` bytes arrived.
    TooLarge,
    /// The body stream failed (a client that went away, say).
    Broken,
}

/// Collects body frames up to a limit, never holding more than the limit plus the frame that
/// went over it. A body that arrives in one frame is kept without a copy.
#[derive(Debug)]
pub(crate) struct Collector {
    first: Option<Bytes>,
    joined: Option<BytesMut>,
    len: usize,
    limit: usize,
}

impl Collector {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            first: None,
            joined: None,
            len: 0,
            limit,
        }
    }

    /// Adds one data frame.
    pub(crate) fn push(&mut self, data: Bytes) -> Result<(), ReadError> {
        self.len = self.len.saturating_add(data.len());
        if self.len > self.limit {
            return Err(ReadError::TooLarge);
        }
        if data.is_empty() {
            return Ok(());
        }
        match (&mut self.first, &mut self.joined) {
            (None, None) => self.first = Some(data),
            (Some(head), None) => {
                let capacity = self.len.max(head.len() * 2).min(self.limit);
                let mut buffer = BytesMut::with_capacity(capacity);
                buffer.extend_from_slice(head);
                buffer.extend_from_slice(&data);
                self.first = None;
                self.joined = Some(buffer);
            }
            (_, Some(buffer)) => buffer.extend_from_slice(&data),
        }
        Ok(())
    }

    /// The whole body.
    pub(crate) fn finish(self) -> Bytes {
        match (self.first, self.joined) {
            (_, Some(buffer)) => buffer.freeze(),
            (Some(head), None) => head,
            (None, None) => Bytes::new(),
        }
    }
}

/// Why a request body stream failed: a length limit of a layer in front (anywhere in the error's
/// chain) is "too large"; anything else is a broken body.
pub(crate) fn body_error(error: impl Into<crate::store::BoxError>) -> ReadError {
    let error = error.into();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
    while let Some(current) = cause {
        if current.is::<http_body_util::LengthLimitError>() {
            return ReadError::TooLarge;
        }
        cause = current.source();
    }
    ReadError::Broken
}

/// Reads a whole body of at most `limit` bytes with a [`Collector`].
pub(crate) async fn read_limited<B>(body: B, limit: usize) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
{
    let mut body = std::pin::pin!(body);
    let mut collector = Collector::new(limit);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ReadError::Broken)?;
        // Trailers carry nothing the contract reads.
        if let Ok(data) = frame.into_data() {
            collector.push(data)?;
        }
    }
    Ok(collector.finish())
}

/// Step 6: exactly one `Idempotency-Key` header, equal to `request_id`.
pub(crate) fn key_matches(headers: &HeaderMap, request_id: &str) -> bool {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    matches!((values.next(), values.next()), (Some(key), None) if key.as_bytes() == request_id.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn content_type(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn media_types() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=\"utf-8\"",
            " application/json ; charset=utf-8 ; q=1",
            "application/json;",
        ] {
            assert!(is_json(&content_type(ok)), "{ok}");
        }
        for bad in [
            "",
            "text/plain",
            "application/json-patch+json",
            "application/jsonx",
            "application/json; charset",
            "application/json; =utf-8",
            "application/json; charset=\"utf-8",
            "application/json; charset=utf 8",
            "application/json, text/plain",
        ] {
            assert!(!is_json(&content_type(bad)), "{bad}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn declared_length() {
        let mut headers = HeaderMap::new();
        assert!(!declares_over(&headers, 4096));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("4096"));
        assert!(!declares_over(&headers, 4096));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("4097"));
        assert!(declares_over(&headers, 4096));
    }
}
