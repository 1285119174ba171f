//! The store key: the endpoint, the `request_id`, and an optional scope (a tenant, an owner)
//! taken from the request.
//!
//! Without a scope, two clients that pick the same `request_id` share one key: the second gets
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
//! A request whose scope is missing where one is configured is refused with
//! `403 {"error":"scope_required"}` before the store is touched.

use std::fmt;
use std::sync::Arc;

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

/// The key the layer claims in the store for `request_id` on the endpoint `path`, within
/// `scope`.
///
/// Unambiguous: `path:request_id` without a scope, `len:scope` + `path:request_id` with one
/// (the scope's byte length first, so no scope can imitate another's key; a path always starts
/// with `/`).
///
/// ```
/// use tower_idempotency::store_key;
///
/// assert_eq!(store_key("/labels", "label-req-7", None), "/labels:label-req-7");
/// assert_eq!(store_key("/labels", "label-req-7", Some("acme")), "4:acme/labels:label-req-7");
/// assert_ne!(store_key("/labels", "r", Some("a")), store_key("/labels", "r", Some("b")));
/// ```
pub fn store_key(path: &str, request_id: &str, scope: Option<&str>) -> String {
    use std::fmt::Write;
    let mut key =
        String::with_capacity(path.len() + request_id.len() + 1 + scope.map_or(0, |s| s.len() + 8));
    if let Some(scope) = scope {
        // Writing into a String cannot fail.
        let _ = write!(key, "{}:{scope}", scope.len());
    }
    key.push_str(path);
    key.push(':');
    key.push_str(request_id);
    key
}
