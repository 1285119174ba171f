//! The layer over an inner service, by concern: the label contract byte for byte, the generic operations, headers and trailers, admission, leases and waits, concurrency, panics, bounded resources, tenants, and composition with axum and tower.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod axum;
mod composition;
mod concurrency;
mod contract;
mod generic;
mod headers;
mod leases;
mod panics;
mod pending_wait;
mod resources;
mod tenants;
mod trailers;
