//! The byte encoding of a [`StoredResponse`] in a remote store, for a store that writes it
//! into a buffer of its own ([`StoredResponse::to_bytes`] and [`StoredResponse::from_bytes`]
//! are [`encode`] and [`decode`]).
//!
//! ```text
//! version:  u8 = 1 (no trailers) or 2
//! status:   u16 big-endian
//! headers:  u16 big-endian count, then per value: name length u16, name, value length u32, value
//! body:     version 1: every remaining byte; version 2: length u32, then the body
//! trailers: version 2 only, as the headers are
//! ```
//!
//! Every header value is kept as bytes (non-UTF-8 included), in order, and the body exactly.
//! Decoding never panics: anything malformed is [`StoreErrorKind::Corrupt`].

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::{StoreError, StoreErrorKind, StoredResponse};

/// The format of a response without trailers.
const VERSION: u8 = 1;

/// The format of a response with trailers.
const WITH_TRAILERS: u8 = 2;

/// The bytes `headers` take in the encoding.
fn fields_len(headers: &HeaderMap) -> usize {
    2 + headers
        .iter()
        .map(|(name, value)| 6 + name.as_str().len() + value.len())
        .sum::<usize>()
}

/// Writes `headers` as a count and each value.
fn put_fields(buffer: &mut BytesMut, headers: &HeaderMap) {
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
}

/// Encodes `response` into one buffer.
pub fn encode(response: &StoredResponse) -> Bytes {
    encode_after(&[], response)
}

/// `prefix`, then `response` as [`encode`] writes it, in one buffer: a record's key and its
/// response in one allocation (the memory store's).
pub fn encode_after(prefix: &[u8], response: &StoredResponse) -> Bytes {
    let mut buffer = BytesMut::with_capacity(prefix.len() + encoded_len(response));
    buffer.put_slice(prefix);
    encode_into(&mut buffer, response);
    buffer.freeze()
}

/// The bytes [`encode`] writes for `response` (or more, for a header map cut off at 65,535
/// values).
pub fn encoded_len(response: &StoredResponse) -> usize {
    3 + fields_len(response.headers())
        + response.body().len()
        + response
            .trailers()
            .map_or(0, |trailers| 4 + fields_len(trailers))
}

/// Appends `response` to `buffer` as [`encode`] writes it.
pub fn encode_into(buffer: &mut BytesMut, response: &StoredResponse) {
    let body = response.body();
    let trailers = response.trailers();
    buffer.put_u8(if trailers.is_some() {
        WITH_TRAILERS
    } else {
        VERSION
    });
    buffer.put_u16(response.status().as_u16());
    put_fields(buffer, response.headers());
    match trailers {
        None => buffer.put_slice(body),
        Some(trailers) => {
            // A stored body is bounded by the layer's response cap, far below 4 GiB.
            buffer.put_u32(body.len() as u32);
            buffer.put_slice(body);
            put_fields(buffer, trailers);
        }
    }
}

/// Reads a count and that many values, as [`put_fields`] writes them.
fn get_fields(bytes: &mut Bytes) -> Result<HeaderMap, StoreError> {
    let corrupt = || StoreError::new(StoreErrorKind::Corrupt);
    if bytes.remaining() < 2 {
        return Err(corrupt());
    }
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
        // Read in place: a name is parsed into its own form, so it needs no share of the
        // buffer.
        let name = header_name(&bytes[..len]).map_err(|_| corrupt())?;
        bytes.advance(len);
        let len = bytes.get_u32() as usize;
        if bytes.remaining() < len {
            return Err(corrupt());
        }
        let value = HeaderValue::from_maybe_shared(bytes.split_to(len)).map_err(|_| corrupt())?;
        headers.try_append(name, value).map_err(|_| corrupt())?;
    }
    Ok(headers)
}

/// A header name read as [`HeaderName::from_bytes`] reads it. The names responses carry most
/// are taken as they are written (lowercase, as [`put_fields`] writes every name), without
/// the general parse: a replay reads every name of its record.
fn header_name(bytes: &[u8]) -> Result<HeaderName, http::header::InvalidHeaderName> {
    use http::header::{
        CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_LENGTH, CONTENT_LOCATION,
        CONTENT_TYPE, DATE, ETAG, EXPIRES, LAST_MODIFIED, LINK, LOCATION, RETRY_AFTER, SET_COOKIE,
        VARY,
    };
    let known = match bytes {
        b"content-type" => CONTENT_TYPE,
        b"content-length" => CONTENT_LENGTH,
        b"location" => LOCATION,
        b"etag" => ETAG,
        b"cache-control" => CACHE_CONTROL,
        b"date" => DATE,
        b"vary" => VARY,
        b"last-modified" => LAST_MODIFIED,
        b"link" => LINK,
        b"retry-after" => RETRY_AFTER,
        b"content-encoding" => CONTENT_ENCODING,
        b"content-language" => CONTENT_LANGUAGE,
        b"content-location" => CONTENT_LOCATION,
        b"expires" => EXPIRES,
        b"set-cookie" => SET_COOKIE,
        _ => return HeaderName::from_bytes(bytes),
    };
    Ok(known)
}

/// Decodes a buffer made by [`encode`]; the body shares `bytes` without a copy.
///
/// # Errors
///
/// [`StoreErrorKind::Corrupt`] for anything malformed; it never panics.
pub fn decode(mut bytes: Bytes) -> Result<StoredResponse, StoreError> {
    let corrupt = || StoreError::new(StoreErrorKind::Corrupt);
    if bytes.remaining() < 3 {
        return Err(corrupt());
    }
    let version = bytes.get_u8();
    if version != VERSION && version != WITH_TRAILERS {
        return Err(corrupt());
    }
    let status = StatusCode::from_u16(bytes.get_u16()).map_err(|_| corrupt())?;
    let headers = get_fields(&mut bytes)?;
    if version == VERSION {
        return Ok(StoredResponse::new(status, headers, bytes));
    }
    if bytes.remaining() < 4 {
        return Err(corrupt());
    }
    let len = bytes.get_u32() as usize;
    if bytes.remaining() < len {
        return Err(corrupt());
    }
    let body = bytes.split_to(len);
    let trailers = get_fields(&mut bytes)?;
    if bytes.has_remaining() {
        return Err(corrupt());
    }
    Ok(StoredResponse::new(status, headers, body).with_trailers(trailers))
}

/// The [`Tombstone`](crate::Tombstone) of the response `encoded` holds, completed at
/// `completed_at`: its status and its first `Location`, read in place (no header map is
/// built), for a store that turns its encoded responses into tombstones.
///
/// ```
/// use std::time::UNIX_EPOCH;
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_idempotency_core::{StoredResponse, Tombstone, codec};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("location", HeaderValue::from_static("/payments/7"));
/// let response = StoredResponse::new(StatusCode::CREATED, headers, "{}".into());
/// let read = codec::tombstone(&codec::encode(&response), UNIX_EPOCH).unwrap();
/// assert_eq!(read, Tombstone::of(&response, UNIX_EPOCH));
/// ```
///
/// # Errors
///
/// [`StoreErrorKind::Corrupt`] for a head that is malformed (the body is not read); it never
/// panics.
pub fn tombstone(
    encoded: &[u8],
    completed_at: std::time::SystemTime,
) -> Result<crate::Tombstone, StoreError> {
    let corrupt = || StoreError::new(StoreErrorKind::Corrupt);
    // Each field split off the front, checked: no length is trusted before it is there.
    let (head, mut bytes) = encoded.split_first_chunk::<5>().ok_or_else(corrupt)?;
    let [version, status_high, status_low, count_high, count_low] = *head;
    if version != VERSION && version != WITH_TRAILERS {
        return Err(corrupt());
    }
    let status = u16::from_be_bytes([status_high, status_low]);
    let status = StatusCode::from_u16(status).map_err(|_| corrupt())?;
    let mut location = None;
    for _ in 0..u16::from_be_bytes([count_high, count_low]) {
        let (name_len, rest) = bytes.split_first_chunk::<2>().ok_or_else(corrupt)?;
        let (name, rest) = rest
            .split_at_checked(usize::from(u16::from_be_bytes(*name_len)))
            .ok_or_else(corrupt)?;
        let (value_len, rest) = rest.split_first_chunk::<4>().ok_or_else(corrupt)?;
        let value_len = usize::try_from(u32::from_be_bytes(*value_len)).map_err(|_| corrupt())?;
        let (value, rest) = rest.split_at_checked(value_len).ok_or_else(corrupt)?;
        bytes = rest;
        if location.is_none() && name.eq_ignore_ascii_case(b"location") {
            location = Some(HeaderValue::from_bytes(value).map_err(|_| corrupt())?);
        }
    }
    Ok(crate::Tombstone::new(completed_at, status, location))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    /// A tombstone read in place is the one the decoded response makes, for every shape of
    /// response; a malformed head is corrupt.
    #[test]
    fn a_tombstone_read_in_place_is_the_decoded_responses() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_234);
        let mut headers = sample().headers().clone();
        headers.append(header::LOCATION, HeaderValue::from_static("/first"));
        headers.append(header::LOCATION, HeaderValue::from_static("/second"));
        let located = StoredResponse::new(StatusCode::CREATED, headers, Bytes::from_static(b"{}"));
        let trailed = located.clone().with_trailers(HeaderMap::new());
        // The head alone, every field ending where the bytes end.
        let bare = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new());
        let mut last = HeaderMap::new();
        last.insert(header::LOCATION, HeaderValue::from_static("/at-the-end"));
        let last = StoredResponse::new(StatusCode::CREATED, last, Bytes::new());
        for response in [sample(), located, trailed, bare, last] {
            let encoded = encode(&response);
            assert_eq!(
                tombstone(&encoded, at).unwrap(),
                crate::Tombstone::of(&response, at)
            );
            // Cut anywhere in its head: corrupt, never a panic.
            let head = encoded.len() - response.body().len();
            for cut in 0..head.min(encoded.len()) {
                if let Ok(read) = tombstone(&encoded[..cut], at) {
                    // Only a cut after every header reads: the same answer.
                    assert_eq!(read, crate::Tombstone::of(&response, at), "cut {cut}");
                }
            }
        }
        assert!(
            tombstone(b"\x03\0\xc9\0\0", at).is_err(),
            "an unknown version"
        );
        assert!(tombstone(b"\x01\0\0\0\0", at).is_err(), "no status");
    }

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
    fn a_name_reads_as_the_general_parse_reads_it() {
        let mut names: Vec<Vec<u8>> = [
            "content-type",
            "content-length",
            "location",
            "etag",
            "cache-control",
            "date",
            "vary",
            "last-modified",
            "link",
            "retry-after",
            "content-encoding",
            "content-language",
            "content-location",
            "expires",
            "set-cookie",
            "Content-Type",
            "ETAG",
            "x-request-id",
            "idempotency-key",
            "content-typ",
            "content-typex",
            "",
            "bad name",
        ]
        .iter()
        .map(|name| name.as_bytes().to_vec())
        .collect();
        names.push(b"etag\xff".to_vec());
        names.push(b"\x00".to_vec());
        for name in names {
            let general = HeaderName::from_bytes(&name);
            match header_name(&name) {
                Ok(fast) => assert_eq!(Some(fast), general.ok(), "{name:?}"),
                Err(_) => assert!(general.is_err(), "{name:?}"),
            }
        }
        // The names taken as written are the standard names, not new ones.
        assert_eq!(header_name(b"etag").unwrap(), http::header::ETAG);
        assert_eq!(
            header_name(b"set-cookie").unwrap(),
            http::header::SET_COOKIE
        );
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
        for unknown in [0u8, 3, 0xff] {
            assert_eq!(
                decode(Bytes::from(vec![unknown, 0, 201, 0, 0]))
                    .unwrap_err()
                    .kind(),
                StoreErrorKind::Corrupt
            );
        }
    }

    fn with_trailers() -> StoredResponse {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("grpc-message", HeaderValue::from_static(""));
        trailers.append("x-trace", HeaderValue::from_bytes(b"a\xff").unwrap());
        trailers.append("x-trace", HeaderValue::from_static("b"));
        sample().with_trailers(trailers)
    }

    #[test]
    fn a_response_without_trailers_keeps_the_first_format() {
        let mut headers = HeaderMap::new();
        headers.insert("a", HeaderValue::from_static("b"));
        let response = StoredResponse::new(StatusCode::CREATED, headers, Bytes::from_static(b"{}"));
        assert_eq!(
            &encode(&response)[..],
            &[1, 0, 201, 0, 1, 0, 1, b'a', 0, 0, 0, 1, b'b', b'{', b'}'][..]
        );
    }

    #[test]
    fn trailers_round_trip_in_the_second_format() {
        let response = with_trailers();
        let encoded = encode(&response);
        assert_eq!(encoded[0], WITH_TRAILERS);
        let decoded = decode(encoded.clone()).unwrap();
        assert_eq!(decoded, response);
        let traces: Vec<_> = decoded
            .trailers()
            .unwrap()
            .get_all("x-trace")
            .iter()
            .collect();
        assert_eq!(traces, [&b"a\xff"[..], b"b"]);
        let empty = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new())
            .with_trailers(HeaderMap::new());
        assert_eq!(decode(encode(&empty)).unwrap(), empty);
        // Every cut is an error: the second format says every length.
        for len in 0..encoded.len() {
            assert!(decode(encoded.slice(..len)).is_err(), "cut at {len}");
        }
        let mut longer = encoded.to_vec();
        longer.push(0);
        assert!(
            decode(Bytes::from(longer)).is_err(),
            "a byte past the trailers"
        );
        for i in 0..encoded.len() {
            for byte in [0x00, 0x7f, 0xff] {
                let mut mutated = encoded.to_vec();
                mutated[i] = byte;
                let _ = decode(Bytes::from(mutated));
            }
        }
    }
}
