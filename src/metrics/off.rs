//! Without the feature `metrics`: the same calls as the feature's module, reporting nothing,
//! so that the layers' code has one shape either way. Each compiles to nothing.

/// A store call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    Claim,
    Complete,
    Release,
    Renew,
}

pub(crate) const WAITING: &str = "";
pub(crate) const SETTLING: &str = "";

/// Nothing to report with (a field, not a unit struct, so that it is made as the feature's
/// is: `Metrics::default()`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    _off: (),
}

impl Metrics {
    #[inline(always)]
    pub(crate) fn outcome(&self, _: crate::Outcome, _: http::StatusCode) {}

    #[inline(always)]
    pub(crate) fn store_call(&self, _: Call, _: Started) {}

    #[inline(always)]
    pub(crate) fn gauge(&self, _: &'static str, _: f64) {}

    #[inline(always)]
    #[cfg_attr(not(feature = "client"), allow(dead_code))]
    pub(crate) fn attempt(&self, _: bool) {}

    #[inline(always)]
    #[cfg_attr(not(feature = "client"), allow(dead_code))]
    pub(crate) fn budget_refused(&self) {}
}

/// No clock read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Started;

impl Started {
    #[inline(always)]
    pub(crate) fn now() -> Self {
        Self
    }
}
