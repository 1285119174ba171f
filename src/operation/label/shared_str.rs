//! [`SharedStr`]: a field of a label body that shares the body's bytes.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// An immutable string that can share the bytes of a request body: the fields of a
/// [`LabelOperation`](crate::operation::LabelOperation) the layer parses point into the body it read, with no copy. It derefs to
/// `str` and compares with strings.
///
/// ```
/// use tower_idempotency::operation::SharedStr;
///
/// let id = SharedStr::from("label-req-7");
/// assert_eq!(id, "label-req-7");
/// assert!(id.starts_with("label-"));
/// assert_eq!(id.as_str().len(), 11);
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct SharedStr(Bytes);

/// Hashed as its `str` is, so that a map keyed by `SharedStr` is looked up by `&str`.
impl std::hash::Hash for SharedStr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl SharedStr {
    /// The part of `body` that `text` is, sharing its bytes; `text` must lie within `body`.
    pub(super) fn within(body: &Bytes, text: Cow<'_, str>) -> Self {
        match text {
            // A field without escapes borrows from the body it was parsed from.
            Cow::Borrowed(text) => Self(body.slice_ref(text.as_bytes())),
            Cow::Owned(text) => Self::from(text),
        }
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        // Only ever made from a `str` (`From`, `within`), so always UTF-8: never the fallback.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::ops::Deref for SharedStr {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::borrow::Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for SharedStr {
    fn from(text: String) -> Self {
        Self(Bytes::from(text))
    }
}

impl From<&str> for SharedStr {
    fn from(text: &str) -> Self {
        Self(Bytes::copy_from_slice(text.as_bytes()))
    }
}

impl From<&String> for SharedStr {
    fn from(text: &String) -> Self {
        Self::from(text.as_str())
    }
}

impl From<Box<str>> for SharedStr {
    fn from(text: Box<str>) -> Self {
        Self::from(String::from(text))
    }
}

impl From<Cow<'_, str>> for SharedStr {
    fn from(text: Cow<'_, str>) -> Self {
        Self::from(text.into_owned())
    }
}

impl From<SharedStr> for String {
    fn from(text: SharedStr) -> Self {
        text.as_str().to_owned()
    }
}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for SharedStr {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for SharedStr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SharedStr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_str_is_its_string() {
        let text = SharedStr::from(String::from("parcel-42"));
        assert_eq!(text, *"parcel-42");
        assert_eq!(text, String::from("parcel-42"));
        assert_eq!(text.to_string(), "parcel-42");
        assert_eq!(format!("{text:?}"), r#""parcel-42""#);
        assert_eq!(String::from(text.clone()), "parcel-42");
        assert_eq!(AsRef::<str>::as_ref(&text), "parcel-42");
        assert_eq!(std::borrow::Borrow::<str>::borrow(&text), "parcel-42");
        let json = serde_json::to_string(&text).unwrap();
        assert_eq!(json, r#""parcel-42""#);
        assert_eq!(serde_json::from_str::<SharedStr>(&json).unwrap(), text);
        assert_ne!(text, "parcel-43");
        assert_ne!(text, *"parcel-43");
        assert_ne!(text, String::from("parcel-43"));
        let owned = String::from("p");
        for other in [
            SharedStr::from(&owned),
            SharedStr::from(Box::<str>::from("p")),
            SharedStr::from(Cow::Borrowed("p")),
        ] {
            assert_eq!(other, "p");
        }
    }

    #[test]
    fn a_shared_str_hashes_as_its_str() {
        let set: std::collections::HashSet<SharedStr> = [SharedStr::from("parcel-42")].into();
        assert!(set.contains("parcel-42"));
        assert!(!set.contains("parcel-43"));
    }
}
