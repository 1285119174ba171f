//! The store key: the method, the concrete path, the client's key, and a scope (a tenant, an
//! owner) taken from the request.
//!
//! Without a scope, two clients that pick the same key share one record: the second gets
//! a conflict, or worse, the first one's stored response. In production, set a scope from what
//! an authentication layer in front put into the request, so every tenant has a key space of its
//! own:
//!
//! ```
//! use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
//!
//! /// Put into the request extensions by an authentication layer in front.
//! #[derive(Clone)]
//! struct Tenant(String);
//!
//! let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
//!     .scope(|parts: &http::request::Parts| parts.extensions.get::<Tenant>().map(|t| t.0.clone()));
//! # drop(layer);
//! ```
//!
//! A request whose scope is missing is refused with the operation's *scope required* answer
//! (`403`) before the store is touched. Every layer chooses its key space before it wraps a
//! service: a scope, or an explicit [`global_keys`](crate::IdempotencyLayer::global_keys)
//! ([`KeySpace`]); forgetting both does not compile.

use std::fmt;
use std::sync::Arc;

use http::Method;
use http::request::Parts;

/// Whose keys a layer guards, chosen once on the
/// [`IdempotencyLayer`](crate::IdempotencyLayer): only a layer with a key space wraps services.
///
/// Sealed: [`Scoped`] and [`GlobalKeys`] are the only key spaces.
#[diagnostic::on_unimplemented(
    message = "the IdempotencyLayer has no key space",
    label = "neither `.scope(…)` nor `.global_keys()` was called on this layer",
    note = "keys are chosen by clients: call `.scope(|parts| …)` to give each tenant its own key \
            space, or `.global_keys()` to share one among all clients"
)]
pub trait KeySpace: sealed::Sealed + Clone + Send + Sync + 'static {}

/// A layer whose key space is not chosen yet: it does not wrap services until
/// [`scope`](crate::IdempotencyLayer::scope) or
/// [`global_keys`](crate::IdempotencyLayer::global_keys) is called.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unscoped;

/// Each request's key space is its scope
/// ([`IdempotencyLayer::scope`](crate::IdempotencyLayer::scope)).
#[derive(Debug, Clone, Copy, Default)]
pub struct Scoped;

/// One key space for every client
/// ([`IdempotencyLayer::global_keys`](crate::IdempotencyLayer::global_keys)).
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKeys;

impl KeySpace for Scoped {}
impl KeySpace for GlobalKeys {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Scoped {}
    impl Sealed for super::GlobalKeys {}
}

/// Takes the key scope from a request; see the [module docs](self).
pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// A configured scope function, with a `Debug` that says it is there.
#[derive(Clone)]
pub(crate) struct Scope(pub(crate) ScopeFn);

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Scope(..)")
    }
}

/// The key the layer claims in the store for the client's `key` on `method` and the concrete
/// `path`, within `scope`.
///
/// Unambiguous: `METHOD path key` without a scope (a method and a path hold no space),
/// `len:scope` before it with one (the scope's byte length first, so no scope can imitate
/// another's key). The same key on two paths, or with two methods, is two operations.
///
/// ```
/// use http::Method;
/// use tower_idempotency::scope::store_key;
///
/// assert_eq!(store_key(None, &Method::POST, "/labels", "label-req-7"), "POST /labels label-req-7");
/// assert_eq!(store_key(Some("acme"), &Method::POST, "/labels", "label-req-7"), "4:acmePOST /labels label-req-7");
/// assert_ne!(
///     store_key(None, &Method::POST, "/payments/a/refunds", "k"),
///     store_key(None, &Method::POST, "/payments/b/refunds", "k"),
/// );
/// ```
pub fn store_key(scope: Option<&str>, method: &Method, path: &str, key: &str) -> String {
    let mut store_key = String::with_capacity(key_len(scope, method, path, key));
    // Writing into a `String` cannot fail.
    let _ = write_key(&mut store_key, scope, method, path, key);
    store_key
}

/// The length of [`store_key`], a scope's decimal length counted as at most 20 digits.
fn key_len(scope: Option<&str>, method: &Method, path: &str, key: &str) -> usize {
    method.as_str().len() + path.len() + key.len() + 2 + scope.map_or(0, |s| s.len() + 21)
}

/// Writes the parts of [`store_key`] into `out`; fails only if `out` is full.
fn write_key(
    out: &mut impl fmt::Write,
    scope: Option<&str>,
    method: &Method,
    path: &str,
    key: &str,
) -> fmt::Result {
    if let Some(scope) = scope {
        write!(out, "{}:{scope}", scope.len())?;
    }
    out.write_str(method.as_str())?;
    out.write_char(' ')?;
    out.write_str(path)?;
    out.write_char(' ')?;
    out.write_str(key)
}

/// The longest store key kept inline in a [`KeyBuf`]: a method, a path and a UUID key with
/// room to spare. Every guarded request's state holds one, so it is kept small.
const INLINE_KEY: usize = 72;

/// A [`store_key`] built without an allocation when it fits [`INLINE_KEY`] bytes, as most do.
pub(crate) enum KeyBuf {
    Inline(InlineKey),
    Heap(String),
}

/// The bytes of an inline key and how many are used. Word-aligned, so that checking the
/// key is UTF-8 (each time it is read as a `str`) runs a word at a time from its start.
#[repr(C, align(8))]
pub(crate) struct InlineKey {
    bytes: [u8; INLINE_KEY],
    len: u8,
}

impl fmt::Write for InlineKey {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let start = usize::from(self.len);
        let end = start + text.len();
        self.bytes
            .get_mut(start..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(text.as_bytes());
        // Within the buffer, so below 256.
        self.len = u8::try_from(end).map_err(|_| fmt::Error)?;
        Ok(())
    }
}

impl KeyBuf {
    /// The [`store_key`] of these parts.
    pub(crate) fn new(scope: Option<&str>, method: &Method, path: &str, key: &str) -> Self {
        if key_len(scope, method, path, key) > INLINE_KEY {
            return Self::Heap(store_key(scope, method, path, key));
        }
        let mut inline = InlineKey {
            bytes: [0; INLINE_KEY],
            len: 0,
        };
        // `key_len` counts at least what is written; were it ever short, the key goes to the
        // heap whole rather than inline cut short.
        match write_key(&mut inline, scope, method, path, key) {
            Ok(()) => Self::Inline(inline),
            Err(fmt::Error) => Self::Heap(store_key(scope, method, path, key)),
        }
    }

    /// The key.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Written only from `str`s, whole: always UTF-8, never the fallback.
            Self::Inline(inline) => {
                std::str::from_utf8(&inline.bytes[..usize::from(inline.len)]).unwrap_or("")
            }
            Self::Heap(key) => key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_buffer_holds_the_store_key_inline_or_not() {
        let long = "k".repeat(200);
        for (scope, key) in [
            (None, "label-req-7"),
            (Some("acme"), "label-req-7"),
            (Some("a-scope-of-more-than-nine-bytes"), "k"),
            (None, long.as_str()),
            (Some(long.as_str()), "k"),
        ] {
            let buffer = KeyBuf::new(scope, &Method::POST, "/labels", key);
            assert_eq!(
                buffer.as_str(),
                store_key(scope, &Method::POST, "/labels", key)
            );
            let inline = matches!(buffer, KeyBuf::Inline(_));
            assert_eq!(
                inline,
                key.len() < 100 && scope.is_none_or(|s| s.len() < 40)
            );
        }
        // Exactly the inline size: inline; one more byte: on the heap.
        let fits = "k".repeat(INLINE_KEY - "POST /labels ".len());
        assert!(matches!(
            KeyBuf::new(None, &Method::POST, "/labels", &fits),
            KeyBuf::Inline(_)
        ));
        let over = format!("{fits}k");
        let buffer = KeyBuf::new(None, &Method::POST, "/labels", &over);
        assert!(matches!(buffer, KeyBuf::Heap(_)));
        assert_eq!(
            buffer.as_str(),
            store_key(None, &Method::POST, "/labels", &over)
        );
    }
}
