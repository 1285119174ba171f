//! The store key: the method, the concrete path, the client's key, and a scope (a tenant, an
//! owner) taken from the request.
//!
//! Without a scope, two clients that pick the same key share one record: the second gets
//! a conflict, or worse, the first one's stored response. In production, set a scope from what
//! an authentication layer in front put into the request, so every tenant has a key space of its
//! own:
//!
//! ```
//! use tower_idempotency::{IdempotencyLayer, MemoryStore};
//!
//! /// Put into the request extensions by an authentication layer in front.
//! #[derive(Clone)]
//! struct Tenant(String);
//!
//! let layer = IdempotencyLayer::new(MemoryStore::new())
//!     .scope(|parts: &http::request::Parts| parts.extensions.get::<Tenant>().map(|t| t.0.clone()));
//! # drop(layer);
//! ```
//!
//! A request whose scope is missing where one is configured is refused with `403`
//! (`scope_required`) before the store is touched. Operations whose keys clients choose
//! ([`JsonOperation`](crate::JsonOperation), [`RawOperation`](crate::RawOperation)) require a
//! scope, or an explicit [`global_keys`](crate::IdempotencyLayer::global_keys).

use std::fmt;
use std::sync::Arc;

use http::Method;
use http::request::Parts;

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
/// use tower_idempotency::store_key;
///
/// assert_eq!(store_key(None, &Method::POST, "/labels", "label-req-7"), "POST /labels label-req-7");
/// assert_eq!(store_key(Some("acme"), &Method::POST, "/labels", "label-req-7"), "4:acmePOST /labels label-req-7");
/// assert_ne!(
///     store_key(None, &Method::POST, "/payments/a/refunds", "k"),
///     store_key(None, &Method::POST, "/payments/b/refunds", "k"),
/// );
/// ```
pub fn store_key(scope: Option<&str>, method: &Method, path: &str, key: &str) -> String {
    use std::fmt::Write;
    let method = method.as_str();
    let mut store_key = String::with_capacity(
        method.len() + path.len() + key.len() + 2 + scope.map_or(0, |s| s.len() + 8),
    );
    if let Some(scope) = scope {
        // Writing into a String cannot fail.
        let _ = write!(store_key, "{}:{scope}", scope.len());
    }
    store_key.push_str(method);
    store_key.push(' ');
    store_key.push_str(path);
    store_key.push(' ');
    store_key.push_str(key);
    store_key
}
