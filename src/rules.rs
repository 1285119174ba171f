//! What a decision reads, whoever runs it (the layer's services, or
//! [`Idempotent`](crate::Idempotent)): a leaf the settings and the pipeline both import.

use std::time::Duration;

use crate::drain::Drain;
use crate::metrics::Metrics;
use crate::store::Lease;
use crate::tally::Tally;

/// The options a decision reads as they were set: a layer's, which its `Config` holds, or a
/// run's. An option the decision reads is a field here, with its default, and the method that
/// sets it (`IdempotencyLayer`'s, and `Idempotent`'s if runs take it too).
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// How long a claim holds its key, and whether an abandoned key is taken over.
    pub(crate) lease: Lease,
    /// How long a decision waits for a pending key's first attempt; `None`: not at all.
    pub(crate) pending_wait: Option<Duration>,
}

/// What the decision's steps read, whoever runs them: the options as set, the series, the
/// drain, and the bounded counts of waits and settlements.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub(crate) options: Options,
    pub(crate) metrics: Metrics,
    pub(crate) drain: Option<Drain>,
    /// Whether a wait for a pending key stops when the layer's client went away
    /// (the task-local `CLIENT_LEFT` the layer sets): the layer's decisions, not a run of
    /// the function API, which may be called from a guarded handler whose client left.
    pub(crate) watch_client: bool,
    /// The decisions waiting now for a pending key, bounded.
    pub(crate) waiting: Tally,
    /// The lost store answers being settled now, bounded.
    pub(crate) settling: Tally,
}
