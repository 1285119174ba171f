//! The fingerprint of an operation: what two attempts with one key must share to be the same
//! operation. A leaf of the crate: the operations compute it, the stores keep it.

use std::fmt;

use sha2::{Digest, Sha256};

/// The SHA-256 fingerprint of an operation: its 32-byte digest, shown as 64 lowercase
/// hexadecimal characters ([`to_hex`](Fingerprint::to_hex), `Display`).
///
/// Held inline as the digest itself: computing, comparing and storing it allocates nothing,
/// and the hexadecimal form is written only where it is shown (a trace, a remote store's
/// record).
///
/// ```
/// use tower_idempotency_core::Fingerprint;
///
/// let fp = Fingerprint::digest([&b"POST /payments"[..], b"{}"]);
/// assert_eq!(fp.to_hex().len(), 64);
/// assert_eq!(fp.to_string(), fp.to_hex().as_str());
/// assert_eq!(fp.as_bytes().len(), 32);
/// assert_ne!(fp, Fingerprint::digest([&b"POST /payments{}"[..]]));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a SHA-256 digest.
    pub fn from_sha256(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// SHA-256 over `parts`, each prefixed with its length so that no two lists of parts share
    /// a digest.
    pub fn digest<P: AsRef<[u8]>>(parts: impl IntoIterator<Item = P>) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            let part = part.as_ref();
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Self::from_sha256(hasher.finalize().into())
    }

    /// The SHA-256 digest, as a store may keep it.
    ///
    /// ```
    /// use tower_idempotency_core::Fingerprint;
    ///
    /// let fp = Fingerprint::from_sha256([7; 32]);
    /// assert_eq!(fp.as_bytes(), &[7; 32]);
    /// ```
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The fingerprint as 64 lowercase hexadecimal characters, written on the stack.
    ///
    /// ```
    /// use tower_idempotency_core::Fingerprint;
    ///
    /// let fp = Fingerprint::from_sha256([0xab; 32]);
    /// assert_eq!(fp.to_hex().as_str(), "ab".repeat(32));
    /// ```
    pub fn to_hex(&self) -> FingerprintHex {
        let mut digits = [0u8; 64];
        // The buffer is exactly twice the digest length, so encoding cannot fail.
        let _ = hex::encode_to_slice(self.0, &mut digits);
        FingerprintHex(digits)
    }

    /// Parses a fingerprint from its 64-character lowercase hexadecimal form, as a store reads
    /// it back.
    ///
    /// ```
    /// use tower_idempotency_core::Fingerprint;
    ///
    /// let fp = Fingerprint::digest(["a", "b"]);
    /// assert_eq!(Fingerprint::parse(&fp.to_hex()), Some(fp));
    /// assert_eq!(Fingerprint::parse(&fp.to_hex().to_uppercase()), None);
    /// assert_eq!(Fingerprint::parse("not hex"), None);
    /// ```
    pub fn parse(text: &str) -> Option<Self> {
        let digits: &[u8; 64] = text.as_bytes().try_into().ok()?;
        if !digits
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return None;
        }
        let mut digest = [0; 32];
        hex::decode_to_slice(digits, &mut digest).ok()?;
        Some(Self(digest))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex().as_str())
    }
}

/// A [`Fingerprint`]'s 64 lowercase hexadecimal characters, held inline; it derefs to `str`.
///
/// ```
/// use tower_idempotency_core::Fingerprint;
///
/// let hex = Fingerprint::digest(["label-req-7", "parcel-42"]).to_hex();
/// assert!(hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
/// assert_eq!(&*hex, hex.as_str());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FingerprintHex([u8; 64]);

impl FingerprintHex {
    /// The characters.
    pub fn as_str(&self) -> &str {
        // Only ever filled with ASCII hex digits by `Fingerprint::to_hex`, so this never
        // falls back to the empty string.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::ops::Deref for FingerprintHex {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for FingerprintHex {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for FingerprintHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for FingerprintHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::Fingerprint;

    #[test]
    fn a_fingerprint_gives_back_its_digest_for_every_byte() {
        for start in [0u8, 32, 64, 96, 128, 160, 192, 224] {
            let digest: [u8; 32] = std::array::from_fn(|i| start.wrapping_add(i as u8));
            let fp = Fingerprint::from_sha256(digest);
            assert_eq!(fp.as_bytes(), &digest);
            assert_eq!(fp.to_hex().as_str(), hex::encode(digest));
            assert_eq!(fp.to_hex().as_ref(), hex::encode(digest));
            assert_eq!(Fingerprint::parse(&fp.to_hex()), Some(fp));
        }
    }
}
