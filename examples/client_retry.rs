//! A small load tool on the client layer: sends intents to a create endpoint, each with one
//! `Idempotency-Key` kept for every attempt, retried within a budget (`ClientLayer`).
//!
//! ```text
//! cargo run --example payments_server &
//! cargo run --features client --example client_retry -- [--url http://HOST:PORT/PATH]
//!     [--count N] [--concurrency C] [--label-contract]
//! ```
//!
//! - `--url`: the endpoint, default the payments server's `http://127.0.0.1:3001/payments`.
//! - `--count N`: how many intents (default 10); `--concurrency C`: how many at once (default 4).
//! - `--label-contract`: send the label contract's body instead of a payment: `request_id` is the
//!   intent's key and `parcel_id` a fresh one (`cargo run --example label_server`, then
//!   `--url http://127.0.0.1:3000/labels --label-contract`).
//!
//! It prints one line per intent (its key, its final status, its attempts), then
//! `intents N, succeeded S, attempts A`, and exits 0 only when every intent succeeded (a
//! `2xx`); 1 otherwise, 2 for a bad command line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceExt};
use tower_idempotency::client::{Attempts, ClientLayer, GaveUp, IntentKey};

const USAGE: &str = "usage: client_retry [--url http://HOST:PORT/PATH] [--count N] \
[--concurrency C] [--label-contract]";

struct Options {
    url: Uri,
    count: usize,
    concurrency: usize,
    label_contract: bool,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        url: Uri::from_static("http://127.0.0.1:3001/payments"),
        count: 10,
        concurrency: 4,
        label_contract: false,
    };
    while let Some(flag) = args.next() {
        if flag == "--label-contract" {
            options.label_contract = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_owned());
        }
        let value = args
            .next()
            .ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}\n{USAGE}");
        match flag.as_str() {
            "--url" => options.url = value.parse().map_err(|e| bad(&e))?,
            "--count" => options.count = value.parse().map_err(|e| bad(&e))?,
            "--concurrency" => {
                let at_once: usize = value.parse().map_err(|e| bad(&e))?;
                options.concurrency = at_once.max(1);
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(options)
}

/// The key of intent `n` of this run: unique across runs, so that a shared store's earlier
/// keys are not replayed. With `--label-contract` it is the body's `request_id` too.
fn key(run: u128, n: usize) -> String {
    format!("intent-{run:x}-{n}")
}

/// Intent `n`'s request: a payment, or with `--label-contract` the label contract's body.
fn intent(options: &Options, run: u128, n: usize) -> Request<Full<Bytes>> {
    let key = key(run, n);
    let body = if options.label_contract {
        format!(r#"{{"request_id":"{key}","parcel_id":"parcel-{run:x}-{n}"}}"#)
    } else {
        format!(r#"{{"amount":{},"currency":"EUR"}}"#, n + 1)
    };
    let mut request = Request::post(options.url.clone())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request");
    // The intent's key, made once before its first attempt: the client layer sends it with
    // every attempt (without it, the layer would make one).
    match HeaderValue::try_from(key) {
        Ok(key) => drop(request.extensions_mut().insert(IntentKey(key))),
        Err(_) => unreachable!("hexadecimal digits and dashes are a header value"),
    }
    request
}

#[tokio::main]
async fn main() {
    let options = match parse(std::env::args().skip(1)) {
        Ok(options) => Arc::new(options),
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let client = ClientLayer::new()
        .attempt_timeout(Duration::from_secs(10))
        .deadline(Duration::from_secs(60))
        .layer(http);
    let next = Arc::new(AtomicUsize::new(0));
    let (succeeded, attempts) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU32::new(0)));
    let workers: Vec<_> = (0..options.concurrency.min(options.count))
        .map(|_| {
            let (client, options, next) = (client.clone(), Arc::clone(&options), Arc::clone(&next));
            let (succeeded, attempts) = (Arc::clone(&succeeded), Arc::clone(&attempts));
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= options.count {
                        return;
                    }
                    let request = intent(&options, run, n);
                    let (status, tries) = match client.clone().oneshot(request).await {
                        Ok(response) => {
                            let tries = response.extensions().get::<Attempts>().map_or(1, |a| a.0);
                            (response.status().as_u16().to_string(), tries)
                        }
                        // Why the layer stopped, and after how many attempts.
                        Err(error) => match error.downcast_ref::<GaveUp>() {
                            Some(gave_up) => (
                                format!("failed ({}: {})", gave_up.stop, gave_up.source),
                                gave_up.attempts,
                            ),
                            None => (format!("failed ({error})"), 0),
                        },
                    };
                    if status.starts_with('2') {
                        succeeded.fetch_add(1, Ordering::Relaxed);
                    }
                    attempts.fetch_add(tries, Ordering::Relaxed);
                    println!("{} {status} attempts {tries}", key(run, n));
                }
            })
        })
        .collect();
    for worker in workers {
        if let Err(error) = worker.await {
            eprintln!("a worker failed: {error}");
        }
    }
    let (succeeded, attempts) = (
        succeeded.load(Ordering::Relaxed),
        attempts.load(Ordering::Relaxed),
    );
    println!(
        "intents {}, succeeded {succeeded}, attempts {attempts}",
        options.count
    );
    std::process::exit(if succeeded == options.count { 0 } else { 1 });
}
