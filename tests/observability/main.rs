//! Traces and metrics. A binary of its own: it installs the process's global tracing subscriber.

#[path = "../common/mod.rs"]
mod common;

mod observability;
