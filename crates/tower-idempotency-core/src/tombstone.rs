//! What a store remembers of a completed operation once its response is gone: a
//! [`Tombstone`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::LOCATION;
use http::{HeaderValue, StatusCode};

use super::{StoreError, StoreErrorKind, StoredResponse};

/// A completed operation whose replay window passed, as the store remembers it for its
/// tombstone window ([`StoreOptions::tombstones`](crate::StoreOptions::tombstones)): when it
/// completed, the create's status, and its `Location` if it had one. A claim with the same
/// fingerprint is answered [`Claim::Expired`](crate::Claim::Expired) with it (the operation
/// took effect and is never created again); another fingerprint is
/// [`Claim::Conflict`](crate::Claim::Conflict), as before the window passed.
///
/// A store keeps it beside the key's digest and the fingerprint, in place of the response; a
/// store that keeps bytes keeps [`to_bytes`](Self::to_bytes) (ten bytes and the `Location`).
/// An application names it `tower_idempotency::store::Tombstone`; the function API's
/// `RunError::Expired` carries one too (a run's status is `200`, with no `Location`).
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_idempotency_core::{StoredResponse, Tombstone};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("location", HeaderValue::from_static("/payments/7"));
/// let created = StoredResponse::new(StatusCode::CREATED, headers, "{}".into());
/// let completed_at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
///
/// let tombstone = Tombstone::of(&created, completed_at);
/// assert_eq!(tombstone.status(), StatusCode::CREATED);
/// assert_eq!(tombstone.location().unwrap(), "/payments/7");
/// assert_eq!(Tombstone::from_bytes(&tombstone.to_bytes()).unwrap(), tombstone);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    /// When it completed, in milliseconds since the Unix epoch (at most [`MAX_MS`], the end
    /// of the year 9999, which fits 48 bits), then the status (16 bits), in one word: an
    /// answer that carries a tombstone is then no larger than the others.
    completed: u64,
    /// The `Location`'s bytes, a valid header value; empty without one (an empty `Location`
    /// says nothing either). Not an option: the answers that carry an optional tombstone stay
    /// as small as the others.
    location: Bytes,
}

/// The latest completion time a tombstone holds: the last millisecond of the year 9999, the
/// last an HTTP date can say (the layer's answer carries it as one).
const MAX_MS: u64 = 253_402_300_799_999;

impl Tombstone {
    /// A tombstone of an operation completed at `completed_at` (kept to the millisecond) with
    /// `status`, its created resource at `location`.
    pub fn new(
        completed_at: SystemTime,
        status: StatusCode,
        location: Option<HeaderValue>,
    ) -> Self {
        Self {
            completed: packed(millis_since_epoch(completed_at).min(MAX_MS), status),
            location: location.map_or_else(Bytes::new, |location| {
                Bytes::copy_from_slice(location.as_bytes())
            }),
        }
    }

    /// The tombstone of `response`, completed at `completed_at`: its status and its first
    /// `Location` header.
    pub fn of(response: &StoredResponse, completed_at: SystemTime) -> Self {
        Self::new(
            completed_at,
            response.status(),
            response.headers().get(LOCATION).cloned(),
        )
    }

    /// When the operation completed (to the millisecond).
    pub fn completed_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.completed >> 16)
    }

    /// The create's status.
    pub fn status(&self) -> StatusCode {
        // Made from a status, or checked as one when read.
        StatusCode::from_u16(self.completed as u16).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The create's `Location`, if it had one.
    pub fn location(&self) -> Option<HeaderValue> {
        // Checked as a header value when it was made or read.
        (!self.location.is_empty())
            .then(|| HeaderValue::from_maybe_shared(self.location.clone()).ok())
            .flatten()
    }

    /// The tombstone in its stored form: the completion time in milliseconds since the Unix
    /// epoch (eight bytes, big-endian), the status (two bytes), then the `Location`'s bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut bytes = BytesMut::with_capacity(self.encoded_len());
        self.encode_into(&mut bytes);
        bytes.freeze()
    }

    /// The bytes [`to_bytes`](Self::to_bytes) writes.
    pub fn encoded_len(&self) -> usize {
        10 + self.location.len()
    }

    /// Appends the tombstone to `buffer` as [`to_bytes`](Self::to_bytes) writes it: a store
    /// that keeps it after other bytes (its key) in one allocation.
    pub fn encode_into(&self, buffer: &mut BytesMut) {
        buffer.put_u64(self.completed >> 16);
        buffer.put_u16(self.completed as u16);
        buffer.put_slice(&self.location);
    }

    /// A tombstone read back from [`to_bytes`](Self::to_bytes): [`StoreErrorKind::Corrupt`]
    /// for bytes it did not write.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StoreError> {
        let corrupt =
            || StoreError::with_source(StoreErrorKind::Corrupt, "an unreadable tombstone");
        let (millis, rest) = bytes.split_first_chunk::<8>().ok_or_else(corrupt)?;
        let (status, location) = rest.split_first_chunk::<2>().ok_or_else(corrupt)?;
        let status = StatusCode::from_u16(u16::from_be_bytes(*status)).map_err(|_| corrupt())?;
        if !location.is_empty() {
            HeaderValue::from_bytes(location).map_err(|_| corrupt())?;
        }
        let location = Bytes::copy_from_slice(location);
        let millis = u64::from_be_bytes(*millis);
        if millis > MAX_MS {
            return Err(corrupt());
        }
        Ok(Self {
            completed: packed(millis, status),
            location,
        })
    }
}

/// A completion time (at most [`MAX_MS`]) and a status in one word: the time's 48 bits, then
/// the status's 16.
fn packed(millis: u64, status: StatusCode) -> u64 {
    (millis << 16) + u64::from(status.as_u16())
}

/// Whole milliseconds since the Unix epoch; zero before it.
fn millis_since_epoch(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn a_tombstone_reads_back_as_it_was_written() {
        let at = UNIX_EPOCH + Duration::from_millis(1_234_567);
        for location in [None, Some(HeaderValue::from_static("/a/b?c=d"))] {
            let tombstone = Tombstone::new(at, StatusCode::ACCEPTED, location);
            let bytes = tombstone.to_bytes();
            assert_eq!(
                bytes.len(),
                10 + tombstone.location().map_or(0, |l| l.len())
            );
            assert_eq!(tombstone.location(), location_given(&bytes));
            assert_eq!(bytes.len(), tombstone.encoded_len());
            let mut after = BytesMut::from(&b"key"[..]);
            tombstone.encode_into(&mut after);
            assert_eq!(&after[3..], &bytes[..]);
            assert_eq!(Tombstone::from_bytes(&bytes).unwrap(), tombstone);
        }
        // Kept to the millisecond; before the epoch is the epoch.
        let fine = Tombstone::new(at + Duration::from_micros(999), StatusCode::OK, None);
        assert_eq!(fine.completed_at(), at);
        let before = Tombstone::new(UNIX_EPOCH - Duration::from_secs(1), StatusCode::OK, None);
        assert_eq!(before.completed_at(), UNIX_EPOCH);
    }

    /// The `Location` as the bytes say, read on its own.
    fn location_given(bytes: &[u8]) -> Option<HeaderValue> {
        (bytes.len() > 10).then(|| HeaderValue::from_bytes(&bytes[10..]).unwrap())
    }

    /// Small: an answer that carries one is no larger than the others.
    #[test]
    fn a_tombstone_is_small() {
        assert!(std::mem::size_of::<Tombstone>() <= 40);
    }

    #[test]
    fn bytes_it_did_not_write_are_corrupt() {
        let good = Tombstone::new(UNIX_EPOCH, StatusCode::CREATED, None).to_bytes();
        let late = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 201];
        // The first millisecond of the year 10000: no HTTP date says it.
        let mut ten_thousand = (MAX_MS + 1).to_be_bytes().to_vec();
        ten_thousand.extend_from_slice(&201_u16.to_be_bytes());
        let error = Tombstone::from_bytes(&ten_thousand).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Corrupt);
        // A clock past it is kept as its last moment, which an HTTP date says.
        let far = UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        let kept = Tombstone::new(far, StatusCode::CREATED, None);
        assert_eq!(
            kept.completed_at(),
            UNIX_EPOCH + Duration::from_millis(MAX_MS)
        );
        assert_eq!(Tombstone::from_bytes(&kept.to_bytes()).unwrap(), kept);
        for bad in [
            &good[..9],
            &[0; 8][..],
            &[0; 10][..],
            b"\0\0\0\0\0\0\0\0\0\xc9\n",
            &late,
        ] {
            let error = Tombstone::from_bytes(bad).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{bad:?}");
        }
    }

    #[test]
    fn a_response_s_tombstone_keeps_its_status_and_first_location() {
        let mut headers = HeaderMap::new();
        headers.append(LOCATION, HeaderValue::from_static("/first"));
        headers.append(LOCATION, HeaderValue::from_static("/second"));
        let response = StoredResponse::new(StatusCode::CREATED, headers, Bytes::new());
        let tombstone = Tombstone::of(&response, UNIX_EPOCH);
        assert_eq!(tombstone.status(), StatusCode::CREATED);
        assert_eq!(tombstone.location().unwrap(), "/first");
        let bare = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new());
        assert_eq!(Tombstone::of(&bare, UNIX_EPOCH).location(), None);
    }
}
