//! Make "create" endpoints idempotent: a [tower] middleware that guarantees a retried create
//! never creates twice.
//!
//! TODO crate docs
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod admission;
mod body;
mod future;
mod layer;
mod operation;
mod reply;
mod service;
pub mod store;
mod validation;

pub use crate::admission::Admission;
pub use crate::body::{RequestBody, ResponseBody};
pub use crate::future::ResponseFuture;
pub use crate::layer::{
    DEFAULT_BODY_LIMIT, DEFAULT_PATH, DEFAULT_RESPONSE_LIMIT, IdempotencyLayer, OtherPaths,
};
pub use crate::operation::{
    Fingerprint, IDEMPOTENCY_KEY, InvalidOperation, LabelOperation, fingerprint,
};
pub use crate::reply::Outcome;
pub use crate::service::Idempotency;
pub use crate::store::{
    Claim, MemoryStore, Reservation, Store, StoreError, StoreErrorKind, StoredResponse,
};
