//! What tombstones cost a SQL store (`--tombstones`): the bytes a record takes while it keeps
//! its response and its tombstone beside it, against a record of a store that keeps none; the
//! bytes a record takes once the purge dropped its response (a tombstone); and the creates a
//! second with tombstones written, against the same store without them, turn by turn.

use super::*;

/// One SQL store's tombstone costs.
pub(crate) struct Costs {
    pub(crate) store: String,
    /// Bytes a completed record, tombstones off, then on.
    pub(crate) completed: (i64, i64),
    /// Bytes a record once buried: its tombstone alone.
    pub(crate) buried: i64,
    /// Creates a second, tombstones off, then on: the medians of the rounds.
    pub(crate) creates: (f64, f64),
    /// Each round's creates a second, off then on.
    pub(crate) rounds: Vec<(f64, f64)>,
}

/// A table's bytes and rows, once compacted (`VACUUM FULL`, `OPTIMIZE TABLE`, `VACUUM`).
pub(crate) type Measured = (i64, i64);

/// The costs of tombstones on `on` (a store that keeps them) against `off` (the same store on
/// a table of its own, keeping none): both filled with `options.records` records of `run`;
/// creates a second of each, turn by turn, `options.rounds` rounds; then every record of `on`'s
/// table expired (`expire`) and purged into its tombstone. `measure(true)` measures `on`'s
/// table, `measure(false)` `off`'s.
pub(crate) async fn costs<St: Store + Purge + Clone + 'static>(
    name: &str,
    (off, on): (St, St),
    run: u64,
    options: &Options,
    response: &StoredResponse,
    measure: impl AsyncFn(bool) -> Measured,
    expire: impl AsyncFn(),
) -> Costs {
    assert!(on.tombstone_window().is_some() && off.tombstone_window().is_none());
    let per_row = |(bytes, rows): Measured| bytes / rows.max(1);
    fill(&off, run, options.records, options.tasks, response).await;
    fill(&on, run, options.records, options.tasks, response).await;
    let completed = (per_row(measure(false).await), per_row(measure(true).await));
    let (off_api, on_api) = (
        Api {
            store: off.clone(),
            response: response.clone(),
        },
        Api {
            store: on.clone(),
            response: response.clone(),
        },
    );
    let mut rounds = Vec::new();
    for round in 0..options.rounds as u64 {
        let salt = (round + 1) << 48;
        let (off_rate, _) = throughput(&off_api, run ^ salt, run, options.records, options).await;
        let (on_rate, _) = throughput(&on_api, run ^ salt, run, options.records, options).await;
        rounds.push((off_rate, on_rate));
    }
    expire().await;
    on.purge_expired().await.expect("the purge");
    let buried = per_row(measure(true).await);
    let median = |pick: fn(&(f64, f64)) -> f64| {
        let mut picked: Vec<f64> = rounds.iter().map(pick).collect();
        picked.sort_by(f64::total_cmp);
        picked[picked.len() / 2]
    };
    Costs {
        store: name.to_owned(),
        completed,
        buried,
        creates: (median(|r| r.0), median(|r| r.1)),
        rounds,
    }
}

/// The costs as a table, and each round.
pub(crate) fn print(costs: &[Costs], options: &Options) {
    println!(
        "\ntombstones: {} records each, {} tasks, {} s a figure, {} rounds",
        options.records, options.tasks, options.seconds, options.rounds
    );
    println!(
        "| store | bytes a completed record, off → on | bytes a tombstone (response dropped) | \
         creates/s off | creates/s on | on ÷ off |"
    );
    println!("|---|---|---|---|---|---|");
    for c in costs {
        println!(
            "| {} | {} → {} | {} | {:.0} | {:.0} | {:.2} |",
            c.store,
            c.completed.0,
            c.completed.1,
            c.buried,
            c.creates.0,
            c.creates.1,
            c.creates.1 / c.creates.0
        );
        for (i, (off, on)) in c.rounds.iter().enumerate() {
            println!("  round {}: off {off:.0}/s, on {on:.0}/s", i + 1);
        }
    }
}
