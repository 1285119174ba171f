//! The label contract's create as a gRPC service: `labels.v1.Labels/CreateLabel`, made idempotent
//! by the layer with [`GrpcOperation`](tower_idempotency::operation::GrpcOperation), on one port for HTTP/2
//! gRPC and for gRPC-web over HTTP/1.1 (tonic-web), beside `grpc.health.v1.Health`, which the
//! layer leaves untouched.
//!
//! ```text
//! cargo run --example grpc_label_server -- [--addr HOST:PORT] [--create-delay-ms N]
//!     [--pending-wait-ms N] [--retention-s N] [--tombstone-s N] [--purge-every-s N] [--max-records N] [--drain-s N] [--wait-for-replicas N] [--store memory|redis://…|postgres://…|sqlite://PATH]
//! cargo run --example grpc_label_server -- client [--addr HOST:PORT] [--key KEY]
//!     [--request-id ID] [--parcel-id ID] [--web]
//! ```
//!
//! The client subcommand makes one `CreateLabel` call (over HTTP/2, or as gRPC-web over
//! HTTP/1.1 with `--web`) and prints its status, its label and its trailers: no `grpcurl`
//! needed. Its `--key` defaults to its `--request-id` (the label contract's rule: they must be equal).

mod common;
mod grpc_labels;

use std::net::SocketAddr;

use grpc_labels::{Labels, LabelsClient, operation, web};
use tower_idempotency::IdempotencyLayer;

const USAGE: &str = "usage: grpc_label_server [--addr HOST:PORT] [--create-delay-ms N] \
[--pending-wait-ms N] [--retention-s N] [--tombstone-s N] [--purge-every-s N] [--max-records N] [--drain-s N] [--wait-for-replicas N] [--store memory|redis://…|redis-cluster://HOST:PORT,…|postgres://…|sqlite://PATH]
       grpc_label_server client [--addr HOST:PORT] [--key KEY] [--request-id ID] \
[--parcel-id ID] [--web]";

/// The default address of the server and of the client.
const ADDR: ([u8; 4], u16) = ([127, 0, 0, 1], 50051);

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("client") {
        args.next();
        std::process::exit(client(args).await);
    }
    common::init_tracing();
    let options = common::options_or_exit(common::Options::parse(
        args,
        SocketAddr::from(ADDR),
        USAGE,
        |_, _| Ok(false),
    ));
    let store = match common::open_store(&options).await {
        Ok(store) => store,
        Err(error) => {
            eprintln!("grpc label server: {error}");
            std::process::exit(1);
        }
    };
    // The key is the request's own id, shared by every client: the label contract's global keys.
    // The label contract's keys are new past their window, as the HTTP label server's.
    let layer = IdempotencyLayer::new(store, operation())
        .global_keys()
        .answer_expired(false);
    let layer = common::with_wait_and_drain(layer, options.pending_wait);
    let listener = match tokio::net::TcpListener::bind(options.addr).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("grpc label server: {}: {error}", options.addr);
            std::process::exit(1);
        }
    };
    tracing::info!(
        addr = %options.addr,
        store = %options.store,
        "grpc label server listening{}",
        common::store_note()
    );
    let labels = Labels::new(options.create_delay);
    let serve = grpc_labels::serve(listener, layer, labels, common::terminated());
    common::drained(serve, options.drain).await;
}

/// The client subcommand: one call, its answer printed; the exit code is 0 for `OK`.
async fn client(mut args: impl Iterator<Item = String>) -> i32 {
    let mut addr = SocketAddr::from(ADDR);
    let (mut key, mut request_id, mut parcel_id, mut over_web) = (
        None,
        "label-req-7".to_owned(),
        "parcel-42".to_owned(),
        false,
    );
    while let Some(flag) = args.next() {
        if flag == "--web" {
            over_web = true;
            continue;
        }
        let Some(value) = args.next().filter(|value| !value.starts_with("--")) else {
            eprintln!("{flag} needs a value\n{USAGE}");
            return 2;
        };
        match flag.as_str() {
            "--addr" => match value.parse() {
                Ok(parsed) => addr = parsed,
                Err(error) => {
                    eprintln!("--addr {value}: {error}");
                    return 2;
                }
            },
            "--key" => key = Some(value),
            "--request-id" => request_id = value,
            "--parcel-id" => parcel_id = value,
            _ => {
                eprintln!("unknown flag {flag}\n{USAGE}");
                return 2;
            }
        }
    }
    let key = key.unwrap_or_else(|| request_id.clone());
    if over_web {
        return match web::create_label(addr, Some(&key), &request_id, &parcel_id).await {
            Ok(answer) => {
                println!("http {}", answer.http);
                if let Some(label) = answer.label().filter(|_| !answer.message.is_empty()) {
                    println!("label {label:?}");
                }
                for line in answer.trailers.split("\r\n").filter(|l| !l.is_empty()) {
                    println!("trailer {line}");
                }
                i32::from(answer.status() != Some("0"))
            }
            Err(error) => {
                eprintln!("call failed: {error}");
                1
            }
        };
    }
    let mut client = match LabelsClient::connect(addr).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("{addr}: {error}");
            return 1;
        }
    };
    match client
        .create_label(Some(&key), &request_id, &parcel_id)
        .await
    {
        Ok(response) => {
            println!("status OK");
            for (name, value) in response.metadata().clone().into_headers().iter() {
                if name.as_str().starts_with("x-") {
                    println!("metadata {name}: {}", value.to_str().unwrap_or("?"));
                }
            }
            println!("label {:?}", response.into_inner());
            0
        }
        Err(status) => {
            println!(
                "status {:?} ({}): {}",
                status.code(),
                status.code() as i32,
                status.message()
            );
            1
        }
    }
}
