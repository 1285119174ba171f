//! Properties over generated inputs: the layer's invariants and canonical JSON.

#[path = "../common/mod.rs"]
mod common;

mod canonical_json;
mod properties;
