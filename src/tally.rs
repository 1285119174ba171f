//! Bounded counts of one layer's tasks of a kind: the requests waiting for a pending key, and
//! the lost store answers being settled. Each is shared by the layer's clones, reported as the
//! layer's gauge, and waited for by its drain.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::drain::Drain;
use crate::metrics::{self, Metrics};

/// A count of one layer's tasks of a kind (requests waiting for a pending key, lost store
/// answers being settled), bounded; shared by the layer's clones.
#[derive(Debug)]
pub(crate) struct Bounded {
    max: usize,
    now: AtomicUsize,
    /// The gauge that reports it.
    series: &'static str,
}

impl Bounded {
    /// A count of requests waiting for a pending key, at most `max`.
    pub(crate) fn waiting(max: usize) -> Self {
        Self::new(max, metrics::WAITING)
    }

    /// A count of lost store answers being settled, at most `max`.
    pub(crate) fn settling(max: usize) -> Self {
        Self::new(max, metrics::SETTLING)
    }

    fn new(max: usize, series: &'static str) -> Self {
        Self {
            max,
            now: AtomicUsize::new(0),
            series,
        }
    }

    /// Takes a place if one is free. A compare-and-swap, not an add undone on refusal: an add
    /// over the bound, however brief, would refuse a place another caller frees meanwhile.
    fn take(&self) -> bool {
        self.now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now < self.max).then_some(now + 1)
            })
            .is_ok()
    }

    /// How many places are taken now.
    #[cfg(test)]
    pub(crate) fn taken(&self) -> usize {
        self.now.load(Ordering::Acquire)
    }
}

/// A layer's use of a [`Bounded`] count: the count, shared, and the layer's series, which
/// report each place taken and given back (a gauge's increment and decrement, so that the
/// counts of layers with one label add up, and no two updates race).
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    bound: Arc<Bounded>,
    metrics: Metrics,
    /// The layer's drain, if any, which waits for the tasks this count bounds.
    drain: Option<Drain>,
}

impl Tally {
    pub(crate) fn new(bound: &Arc<Bounded>, metrics: &Metrics) -> Self {
        Self {
            bound: Arc::clone(bound),
            metrics: metrics.clone(),
            drain: None,
        }
    }

    /// This count, its tasks waited for by `drain`.
    pub(crate) fn with_drain(mut self, drain: Option<Drain>) -> Self {
        self.drain = drain;
        self
    }

    /// The drain that waits for this count's tasks, if any.
    pub(crate) fn drain(&self) -> Option<&Drain> {
        self.drain.as_ref()
    }

    /// The layer's series.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A place, if there is one.
    pub(crate) fn enter(&self) -> Option<Slot<'_>> {
        // Lazily: a slot made and dropped would give back a place never taken.
        self.take().then(|| Slot(self))
    }

    /// A place a task can own, if there is one.
    pub(crate) fn enter_owned(&self) -> Option<OwnedSlot> {
        self.take().then(|| OwnedSlot(self.clone()))
    }

    fn take(&self) -> bool {
        let taken = self.bound.take();
        if taken {
            self.metrics.gauge(self.bound.series, 1.0);
        }
        taken
    }

    /// Gives a place back.
    fn give(&self) {
        self.bound.now.fetch_sub(1, Ordering::AcqRel);
        self.metrics.gauge(self.bound.series, -1.0);
    }

    /// How many places are taken now.
    #[cfg(test)]
    pub(crate) fn taken(&self) -> usize {
        self.bound.taken()
    }
}

/// One place of a [`Bounded`] count, given back when dropped.
pub(crate) struct Slot<'a>(&'a Tally);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.give();
    }
}

/// One place of a [`Bounded`] count a task owns, given back when dropped.
pub(crate) struct OwnedSlot(Tally);

impl Drop for OwnedSlot {
    fn drop(&mut self) {
        self.0.give();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, MAX_SETTLING};

    /// The tally of `config`'s `bound`, reported under the default label.
    fn tally(bound: &Arc<Bounded>) -> Tally {
        Tally::new(bound, &Metrics::default())
    }

    /// Each layer settles lost store answers within a bound of its own: one layer's full
    /// count (a long outage of its store) leaves another's places free, and the clones of a
    /// layer (its configuration cloned) share theirs; a place is given back when its task ends.
    #[test]
    fn each_layer_settles_within_its_own_bound() {
        let (a, b) = (Config::default(), Config::default());
        let settling = tally(&a.settling);
        let held: Vec<_> = (0..MAX_SETTLING)
            .map(|_| settling.enter_owned().expect("a place"))
            .collect();
        assert!(settling.enter_owned().is_none(), "a's bound is reached");
        assert!(
            tally(&a.clone().settling).enter_owned().is_none(),
            "its clone shares it"
        );
        assert!(
            tally(&b.settling).enter_owned().is_some(),
            "b's places are its own"
        );
        drop(held);
        assert_eq!(settling.taken(), 0);
        let waiting = tally(&a.waiting);
        let place = waiting.enter();
        assert_eq!((waiting.taken(), settling.taken()), (1, 0));
        drop(place);
        assert_eq!(waiting.taken(), 0);
    }

    /// A place refused gives nothing back: the count stays at its bound, and the places held
    /// are given back one each.
    #[test]
    fn a_refused_place_leaves_the_count_as_it_was() {
        let bounded = tally(&Arc::new(Bounded::waiting(1)));
        let held = bounded.enter().expect("a place");
        assert!(bounded.enter().is_none());
        assert!(bounded.enter_owned().is_none());
        assert_eq!(bounded.taken(), 1);
        drop(held);
        assert_eq!(bounded.taken(), 0);
        let owned = bounded.enter_owned().expect("the place again");
        assert!(bounded.enter().is_none());
        drop(owned);
        assert_eq!(bounded.taken(), 0);
    }

    /// A count is its layer's gauge, moved up and down as each place is taken and given back:
    /// the counts of two layers with one label add up, and a layer labelled otherwise shares
    /// its bound but reports under its own label.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_count_is_reported_as_its_layers_gauge() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let scrape = recorder.handle();
        let _local = ::metrics::set_default_local_recorder(&recorder);
        let orders = Metrics::new("orders".into());
        let bound = Arc::new(Bounded::settling(2));
        let settling = Tally::new(&bound, &orders);
        let other = Tally::new(&Arc::new(Bounded::settling(10)), &orders);
        let relabelled = Tally::new(&bound, &Metrics::new("other".into()));
        let gauge = |series: &str, layer: &str| {
            let line = format!("{series}{{layer=\"{layer}\"}} ");
            scrape
                .render()
                .lines()
                .find_map(|l| l.strip_prefix(&line).map(str::to_owned))
        };
        let one = settling.enter_owned().expect("a place");
        let two = settling.enter().expect("a place");
        assert!(settling.enter().is_none());
        assert!(relabelled.enter().is_none(), "the bound is shared");
        assert_eq!(gauge(metrics::SETTLING, "orders").as_deref(), Some("2"));
        let three = other.enter().expect("a place of its own");
        assert_eq!(gauge(metrics::SETTLING, "orders").as_deref(), Some("3"));
        drop(one);
        drop(three);
        assert_eq!(gauge(metrics::SETTLING, "orders").as_deref(), Some("1"));
        drop(two);
        assert_eq!(gauge(metrics::SETTLING, "orders").as_deref(), Some("0"));
        let _place = relabelled.enter().expect("a place");
        assert_eq!(gauge(metrics::SETTLING, "other").as_deref(), Some("1"));
        assert_eq!(gauge(metrics::SETTLING, "orders").as_deref(), Some("0"));
    }
}
