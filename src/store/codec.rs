//! The byte encoding of a [`StoredResponse`] in a remote store.
//!
//! ```text
//! version: u8 = 1
//! status:  u16 big-endian
//! headers: u16 big-endian count, then per value: name length u16, name, value length u32, value
//! body:    every remaining byte
//! ```
//!
//! Every header value is kept as bytes (non-UTF-8 included), in order, and the body exactly.
//! Decoding never panics: anything malformed is [`StoreErrorKind::Corrupt`].

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::{StoreError, StoreErrorKind, StoredResponse};

const VERSION: u8 = 1;

/// Encodes `response` into one buffer.
pub(crate) fn encode(response: &StoredResponse) -> Bytes {
    let headers = response.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| 6 + name.as_str().len() + value.len())
        .sum();
    let mut buffer = BytesMut::with_capacity(5 + header_bytes + response.body().len());
    buffer.put_u8(VERSION);
    buffer.put_u16(response.status().as_u16());
    // A header map holds far fewer than 65536 values in practice; more are cut off rather than
    // corrupting the record.
    let count = u16::try_from(headers.len()).unwrap_or(u16::MAX);
    buffer.put_u16(count);
    for (name, value) in headers.iter().take(usize::from(count)) {
        // Header names are short tokens and values are bounded by the server's header limits,
        // far below these field widths.
        buffer.put_u16(name.as_str().len() as u16);
        buffer.put_slice(name.as_str().as_bytes());
        buffer.put_u32(value.len() as u32);
        buffer.put_slice(value.as_bytes());
    }
    buffer.put_slice(response.body());
    buffer.freeze()
}

/// Decodes a buffer made by [`encode`]; the body shares `bytes` without a copy.
pub(crate) fn decode(mut bytes: Bytes) -> Result<StoredResponse, StoreError> {
    let corrupt = || StoreError::new(StoreErrorKind::Corrupt);
    if bytes.remaining() < 5 || bytes.get_u8() != VERSION {
        return Err(corrupt());
    }
    let status = StatusCode::from_u16(bytes.get_u16()).map_err(|_| corrupt())?;
    let count = bytes.get_u16();
    // Capacity is only a hint: a corrupt count must not reserve (or panic on) a huge map.
    let mut headers =
        HeaderMap::try_with_capacity(usize::from(count).min(64)).map_err(|_| corrupt())?;
    for _ in 0..count {
        if bytes.remaining() < 2 {
            return Err(corrupt());
        }
        let len = usize::from(bytes.get_u16());
        if bytes.remaining() < len + 4 {
            return Err(corrupt());
        }
        let name = HeaderName::from_bytes(&bytes.split_to(len)).map_err(|_| corrupt())?;
        let len = bytes.get_u32() as usize;
        if bytes.remaining() < len {
            return Err(corrupt());
        }
        let value = HeaderValue::from_maybe_shared(bytes.split_to(len)).map_err(|_| corrupt())?;
        headers.try_append(name, value).map_err(|_| corrupt())?;
    }
    Ok(StoredResponse::new(status, headers, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    fn sample() -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.append(header::ETAG, HeaderValue::from_static("\"label-901-v1\""));
        headers.append(header::ETAG, HeaderValue::from_static("\"backup\""));
        headers.insert(
            "x-raw",
            HeaderValue::from_bytes(b"\xff\x80 caf\xe9").unwrap(),
        );
        StoredResponse::new(
            StatusCode::CREATED,
            headers,
            Bytes::from_static(b"{}\0\xff"),
        )
    }

    #[test]
    fn round_trip_keeps_every_value_and_byte() {
        let response = sample();
        let decoded = decode(encode(&response)).unwrap();
        assert_eq!(decoded, response);
        let etags: Vec<_> = decoded.headers().get_all(header::ETAG).iter().collect();
        assert_eq!(etags, ["\"label-901-v1\"", "\"backup\""]);
        let empty = StoredResponse::new(StatusCode::NO_CONTENT, HeaderMap::new(), Bytes::new());
        assert_eq!(decode(encode(&empty)).unwrap(), empty);
    }

    #[test]
    fn every_truncation_and_mutation_is_an_error_or_a_value_never_a_panic() {
        let encoded = encode(&sample());
        for len in 0..encoded.len() {
            let _ = decode(encoded.slice(..len));
        }
        for i in 0..encoded.len() {
            for byte in [0x00, 0x7f, 0xff] {
                let mut mutated = encoded.to_vec();
                mutated[i] = byte;
                let _ = decode(Bytes::from(mutated));
            }
        }
        assert_eq!(
            decode(Bytes::new()).unwrap_err().kind(),
            StoreErrorKind::Corrupt
        );
        assert_eq!(
            decode(Bytes::from_static(&[2, 0, 201, 0, 0]))
                .unwrap_err()
                .kind(),
            StoreErrorKind::Corrupt
        );
    }
}
