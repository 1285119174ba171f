//! The slowest claims of a memory store filling up, on its default tables and sized up front
//! with `MemoryStoreBuilder::reserve`: a table that grows moves every record of its shard
//! under the shard's lock, and the claim that makes it grow waits for that.
//!
//! Then the same under churn: a store that holds a window of a sixteenth of the keys, filled
//! before the timed loop, claims every key once more while the record a window back is
//! dropped (as a retention window's sweep drops it): sixteen times its records of churn, in
//! which a table more than half full fills its free slots with deleted marks and grows.
//!
//! `cargo bench --bench claim_tail [keys, default 1000000] [rounds, default 2]`: each round
//! claims that many distinct keys on a fresh store of each kind, in turn (which goes first
//! alternates round by round), one at a time on a current-thread runtime, and prints the
//! percentiles of one claim's time. The keys and fingerprints are made before the timed loop.

use std::time::{Duration, Instant};

use tower_idempotency::MemoryStore;
use tower_idempotency::operation::Fingerprint;
use tower_idempotency::operation::LabelContract;
use tower_idempotency::store::Claim;
use tower_idempotency::store::Operator;
use tower_idempotency::store::Store;

/// Every claim's time, in nanoseconds, sorted; and the whole run's. Under `churn`, each
/// claim is followed by forgetting the key that many claims back: outside each claim's
/// time, inside the whole run's (so a churn row's mean is a claim's and a forget's).
fn claims(
    runtime: &tokio::runtime::Runtime,
    store: &MemoryStore,
    keys: &[(String, Fingerprint)],
    churn: Option<usize>,
) -> (Vec<u64>, Duration) {
    let mut times = Vec::with_capacity(keys.len());
    let started = Instant::now();
    runtime.block_on(async {
        for (i, (key, fingerprint)) in keys.iter().enumerate() {
            let claimed = Instant::now();
            let claim = store.claim(key, fingerprint).await.expect("a claim");
            times.push(claimed.elapsed().as_nanos() as u64);
            assert!(matches!(claim, Claim::New(_)), "every key is new");
            if let Some(window) = churn {
                let old = &keys[(i + keys.len() - window) % keys.len()].0;
                assert!(store.forget(old).await.expect("a forget"), "held");
            }
        }
    });
    let elapsed = started.elapsed();
    times.sort_unstable();
    (times, elapsed)
}

/// A row of the percentiles of `times`, sorted, over a run of `elapsed`.
fn row(round: usize, name: &str, times: &[u64], elapsed: Duration) -> String {
    let n = times.len();
    let at = |q: f64| times[((n as f64 * q) as usize).clamp(1, n) - 1];
    let us = |ns: u64| format!("{:.1} µs", ns as f64 / 1000.0);
    format!(
        "| {round} | {name} | {} | {} | {} | {} | {} | {} |",
        us((elapsed.as_nanos() / n as u128) as u64),
        us(at(0.5)),
        us(at(0.99)),
        us(at(0.999)),
        us(at(0.9999)),
        us(times[n - 1]),
    )
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let keys: usize = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000)
        .max(2);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let keys: Vec<(String, Fingerprint)> = (0..keys)
        .map(|i| {
            let key = format!("POST /labels k-{i}");
            let fingerprint = LabelContract::fingerprint(&key, "parcel-42");
            (key, fingerprint)
        })
        .collect();
    let n = keys.len();
    let header = "| round | store | mean | p50 | p99 | p99.9 | p99.99 | slowest |\n|---|---|---|---|---|---|---|---|";
    println!("Filling up, {n} keys:\n\n{header}");
    let window = (n / 16).max(1);
    let mut churned = Vec::new();
    for round in 1..=rounds {
        // Each store made when its turn comes, and the order alternated round by round: the
        // one measured second finds the heap the first one left.
        let mut order = [false, true];
        if round % 2 == 0 {
            order.reverse();
        }
        for sized in order {
            let (name, make) = if sized {
                (
                    "sized",
                    MemoryStore::builder()
                        .keep_forever()
                        .unbounded()
                        .reserve(n)
                        .build(),
                )
            } else {
                (
                    "default",
                    MemoryStore::builder().keep_forever().unbounded().build(),
                )
            };
            let (times, elapsed) = claims(&runtime, &make, &keys, None);
            println!("{}", row(round, name, &times, elapsed));
            drop(make);
            // Under churn: the window's keys claimed first, untimed, then every key once
            // more, the first window's again after their records were dropped.
            let store = if sized {
                MemoryStore::builder()
                    .keep_forever()
                    .unbounded()
                    .reserve(window)
                    .build()
            } else {
                MemoryStore::builder().keep_forever().unbounded().build()
            };
            claims(&runtime, &store, &keys[n - window..], None);
            let (times, elapsed) = claims(&runtime, &store, &keys, Some(window));
            churned.push(row(round, name, &times, elapsed));
        }
    }
    println!("\nUnder churn, holding {window} keys, {n} claims:\n\n{header}");
    for row in churned {
        println!("{row}");
    }
}
