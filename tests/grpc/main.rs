//! gRPC and gRPC-web: the operation, the example server, and tonic.

#[path = "../common/mod.rs"]
mod common;

mod grpc;
mod grpc_server;
mod tonic;
