//! The layer over an inner service, by concern: the label contract byte for byte, the generic operations, headers and trailers, admission, leases and waits, concurrency, panics, bounded resources, tenants, and composition with axum and tower.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod axum;
mod check;
mod composition;
mod concurrency;
mod contract;
mod drain;
mod generic;
mod headers;
mod keys;
mod leases;
mod panics;
mod pending_wait;
mod problems;
mod raw;
mod resources;
mod stored;
mod tenants;
mod trailers;
mod window;
