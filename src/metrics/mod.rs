//! Metrics through the [`metrics`](https://docs.rs/metrics) facade, behind the feature
//! `metrics`: what the layers count and time, for whichever exporter the application installs,
//! such as Prometheus, StatsD or OpenTelemetry. Without an exporter installed, each report
//! costs a load of the facade's recorder and nothing more; without the feature, nothing at all.
//!
//! Every series carries a `layer` label: the layer's
//! [`metrics_label`](crate::IdempotencyLayer::metrics_label), or for the client layer its
//! [`metrics_label`](crate::client::ClientLayer::metrics_label); `"default"` unless set.
//!
//! | series | kind | more labels | what it counts |
//! |---|---|---|---|
//! | [`REQUESTS`] | counter | `outcome`, `status` | guarded requests by [`Outcome`]: `created`, `replay`, `conflict`, `pending`, `not_admitted` and `rejected` (refused, by `status`), `store_unavailable`, `unknown`, `create_failed`, `complete_failed`, `unstored`; `status` is the answer's |
//! | [`STORE_CALL_SECONDS`] | histogram | `call` | the time of each store call of a request: `claim`, `complete`, `release`, `renew` |
//! | [`WAITING`] | gauge | | requests waiting now for a pending key's first attempt; see [`pending_wait`](crate::IdempotencyLayer::pending_wait) |
//! | [`SETTLING`] | gauge | | lost store answers being settled now, each in a task of its own |
//! | [`REDIS_SYNCING_PRIMARIES`] | gauge | (no `layer`) | Redis primaries whose replicas are all still syncing (a first sync, a resync after a restart), so that the default replica wait waits for none on them; set at each look at the replicas |
//! | [`CLIENT_ATTEMPTS`] | counter | `attempt`: `first` or `retry` | attempts the client layer sent |
//! | [`CLIENT_BUDGET_REFUSALS`] | counter | | retries the client layer's budget refused, giving the last answer instead |
//!
//! The crate reports through `metrics` 0.24: install an exporter built on that version. With
//! `metrics-exporter-prometheus` 0.18, store call times as histograms rather than its
//! default summaries, and the scrape on a port of its own:
//!
//! ```
//! # #[cfg(feature = "metrics")] // the file also builds, silent, without the feature
//! # mod example {
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//! use tower_idempotency::metrics::STORE_CALL_SECONDS;
//! use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! PrometheusBuilder::new()
//!     .with_http_listener(([127, 0, 0, 1], 9464))
//!     .set_buckets_for_metric(
//!         Matcher::Full(STORE_CALL_SECONDS.to_owned()),
//!         &[0.0001, 0.001, 0.01, 0.1, 1.0],
//!     )?
//!     .install()?;
//! // This layer's series carry `layer="payments"`.
//! let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
//!     .global_keys()
//!     .metrics_label("payments");
//! # drop(layer); Ok(()) }
//! # }
//! # fn main() {}
//! ```

use crate::reply::Outcome;

/// Guarded requests by outcome. A counter, labels `layer`, `outcome`, `status`.
pub const REQUESTS: &str = "idempotency_requests_total";
/// The time of a store call, in seconds. A histogram, labels `layer`, `call`.
pub const STORE_CALL_SECONDS: &str = "idempotency_store_call_seconds";
/// Requests waiting for a pending key's first attempt now. A gauge, label `layer`.
pub const WAITING: &str = "idempotency_waiting";
/// Lost store answers being settled now. A gauge, label `layer`.
pub const SETTLING: &str = "idempotency_settling";
/// Redis primaries with replicas none of which is online yet, so that the default replica
/// wait waits for none of theirs. A gauge, no labels; see
/// [`RedisStore::wait_for_replicas`](crate::store::RedisStore::wait_for_replicas).
pub const REDIS_SYNCING_PRIMARIES: &str = "idempotency_redis_syncing_primaries";
/// Attempts sent by the client layer. A counter, labels `layer`, `attempt`.
pub const CLIENT_ATTEMPTS: &str = "idempotency_client_attempts_total";
/// Retries the client layer's budget refused. A counter, label `layer`.
pub const CLIENT_BUDGET_REFUSALS: &str = "idempotency_client_budget_refusals_total";

/// The label a layer's series carry unless it is given one.
pub const DEFAULT_LABEL: &str = "default";

/// Describes every series of the table above to the installed recorder: its unit and what
/// it counts, as exporters show them (Prometheus's `# HELP` lines, say). Call it once, after
/// installing the recorder; a series reported without it is the same series, undescribed.
///
/// ```
/// let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
/// let handle = recorder.handle();
/// metrics::with_local_recorder(&recorder, || {
///     tower_idempotency::metrics::describe();
///     metrics::counter!(tower_idempotency::metrics::REQUESTS).increment(1);
/// });
/// assert!(handle.render().contains("# HELP idempotency_requests_total guarded requests"));
/// ```
#[cfg(feature = "metrics")]
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        REQUESTS,
        Unit::Count,
        "guarded requests, by outcome and status"
    );
    describe_histogram!(
        STORE_CALL_SECONDS,
        Unit::Seconds,
        "the time of each store call of a request, by call"
    );
    describe_gauge!(
        WAITING,
        Unit::Count,
        "requests waiting now for a pending key's first attempt"
    );
    describe_gauge!(
        SETTLING,
        Unit::Count,
        "lost store answers being settled now"
    );
    describe_gauge!(
        REDIS_SYNCING_PRIMARIES,
        Unit::Count,
        "Redis primaries whose replicas are all still syncing"
    );
    describe_counter!(
        CLIENT_ATTEMPTS,
        Unit::Count,
        "attempts the client layer sent, by attempt (first or retry)"
    );
    describe_counter!(
        CLIENT_BUDGET_REFUSALS,
        Unit::Count,
        "retries the client layer's budget refused"
    );
}

/// A store call, as [`STORE_CALL_SECONDS`]'s `call` label names it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    Claim,
    Complete,
    Release,
    Renew,
}

impl Call {
    #[cfg(feature = "metrics")]
    fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::Renew => "renew",
        }
    }
}

/// What one layer reports its series with: its label. Without the feature it holds nothing,
/// and each report below compiles to nothing: one file either way, no mirror to keep.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    #[cfg(feature = "metrics")]
    layer: ::metrics::SharedString,
}

// Derivable only without the feature, where the struct holds nothing.
#[allow(clippy::derivable_impls)]
impl Default for Metrics {
    fn default() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            layer: ::metrics::SharedString::const_str(DEFAULT_LABEL),
        }
    }
}

impl Metrics {
    /// The series of a layer labelled `layer`.
    #[cfg(feature = "metrics")]
    pub(crate) fn new(layer: std::borrow::Cow<'static, str>) -> Self {
        let layer = match layer {
            std::borrow::Cow::Borrowed(layer) => ::metrics::SharedString::const_str(layer),
            std::borrow::Cow::Owned(layer) => ::metrics::SharedString::from_owned(layer),
        };
        Self { layer }
    }

    /// One guarded request answered with `outcome` and `status`.
    #[inline(always)]
    pub(crate) fn outcome(&self, outcome: Outcome, status: http::StatusCode) {
        #[cfg(feature = "metrics")]
        ::metrics::counter!(
            REQUESTS,
            "layer" => self.layer.clone(),
            "outcome" => outcome.as_str(),
            "status" => status_label(status),
        )
        .increment(1);
        #[cfg(not(feature = "metrics"))]
        let _ = (outcome, status);
    }

    /// `call` took from `started` until now.
    #[inline(always)]
    pub(crate) fn store_call(&self, call: Call, started: Started) {
        #[cfg(feature = "metrics")]
        ::metrics::histogram!(
            STORE_CALL_SECONDS,
            "layer" => self.layer.clone(),
            "call" => call.as_str(),
        )
        .record(started.at.elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = (call, started);
    }

    /// `series`, a gauge, moves by `delta`.
    #[inline(always)]
    pub(crate) fn gauge(&self, series: &'static str, delta: f64) {
        #[cfg(feature = "metrics")]
        ::metrics::gauge!(series, "layer" => self.layer.clone()).increment(delta);
        #[cfg(not(feature = "metrics"))]
        let _ = (series, delta);
    }
}

/// When a store call started; without the feature, no clock is read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Started {
    #[cfg(feature = "metrics")]
    at: std::time::Instant,
}

impl Started {
    #[inline(always)]
    pub(crate) fn now() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            at: std::time::Instant::now(),
        }
    }
}

/// `status` as a label value: the statuses the layer answers with, without an allocation;
/// others written out.
#[cfg(feature = "metrics")]
fn status_label(status: http::StatusCode) -> ::metrics::SharedString {
    let known = match status.as_u16() {
        200 => "200",
        201 => "201",
        202 => "202",
        204 => "204",
        400 => "400",
        403 => "403",
        404 => "404",
        405 => "405",
        409 => "409",
        413 => "413",
        415 => "415",
        422 => "422",
        429 => "429",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        _ => return ::metrics::SharedString::from_owned(status.as_str().to_owned()),
    };
    ::metrics::SharedString::const_str(known)
}

#[cfg(test)]
mod names {
    /// The Redis store's crate names its gauge as this module does.
    #[cfg(feature = "redis")]
    #[test]
    fn the_redis_store_reports_the_gauge_named_here() {
        assert_eq!(
            super::REDIS_SYNCING_PRIMARIES,
            tower_idempotency_redis::REDIS_SYNCING_PRIMARIES
        );
    }

    /// The client's crate names its counters as this module does.
    #[cfg(feature = "client")]
    #[test]
    fn the_client_reports_the_counters_named_here() {
        assert_eq!(super::CLIENT_ATTEMPTS, crate::client::CLIENT_ATTEMPTS);
        assert_eq!(
            super::CLIENT_BUDGET_REFUSALS,
            crate::client::CLIENT_BUDGET_REFUSALS
        );
    }
}
