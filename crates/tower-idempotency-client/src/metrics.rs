//! The client layer's series, through the `metrics` facade with the feature `metrics`; without
//! it each report compiles to nothing, in the same code.

/// Attempts sent by the client layer: a counter, labels `layer` and `attempt` (`first` or
/// `retry`).
pub const CLIENT_ATTEMPTS: &str = "idempotency_client_attempts_total";

/// Retries the client layer's budget refused, giving the last answer instead: a counter,
/// label `layer`.
pub const CLIENT_BUDGET_REFUSALS: &str = "idempotency_client_budget_refusals_total";

/// The `layer` label of a layer that was not given one.
#[cfg(feature = "metrics")]
const DEFAULT_LABEL: &str = "default";

/// What one client layer reports its series with: its label.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    #[cfg(feature = "metrics")]
    layer: metrics::SharedString,
}

// Derivable only without the feature, where the struct holds nothing.
#[allow(clippy::derivable_impls)]
impl Default for Metrics {
    fn default() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            layer: metrics::SharedString::const_str(DEFAULT_LABEL),
        }
    }
}

impl Metrics {
    /// The series of a layer labelled `layer`.
    #[cfg(feature = "metrics")]
    pub(crate) fn new(layer: std::borrow::Cow<'static, str>) -> Self {
        let layer = match layer {
            std::borrow::Cow::Borrowed(layer) => metrics::SharedString::const_str(layer),
            std::borrow::Cow::Owned(layer) => metrics::SharedString::from_owned(layer),
        };
        Self { layer }
    }

    /// The layer sent an attempt: a retry if `retry`, else its first.
    #[inline]
    pub(crate) fn attempt(&self, retry: bool) {
        #[cfg(feature = "metrics")]
        {
            let attempt = if retry { "retry" } else { "first" };
            metrics::counter!(CLIENT_ATTEMPTS, "layer" => self.layer.clone(), "attempt" => attempt)
                .increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = retry;
    }

    /// The layer's budget refused a retry.
    #[inline]
    pub(crate) fn budget_refused(&self) {
        #[cfg(feature = "metrics")]
        metrics::counter!(CLIENT_BUDGET_REFUSALS, "layer" => self.layer.clone()).increment(1);
    }
}
