//! The futures a decision runs its steps in: the create under lease renewals, and any step
//! with its panic caught once.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::wait::tokio_timer;
use crate::metrics::{Call, Metrics, Started};
use crate::store::{Reservation, Store, StoreErrorKind};

/// Runs `work` while renewing the lease of `reservation` every third of `lease`, on fixed
/// deadlines (a slow renewal does not push the later ones back), so the key shows as in
/// progress, not abandoned, however long `work` takes. The renewals start only once `work`
/// waits: work that finishes at its first poll costs no timer, and no room: the renewing
/// future is made, boxed, only then.
pub(super) fn renewing<'a, F: Future, St: Store>(
    work: F,
    store: &'a St,
    key: &'a str,
    reservation: &'a Reservation,
    lease: Duration,
    metrics: &'a Metrics,
) -> WhileRenewing<'a, F, impl FnOnce() -> Renewals<'a>> {
    let start =
        move || -> Renewals<'a> { Box::pin(renew(store, key, reservation, lease, metrics)) };
    WhileRenewing {
        work,
        start: Some(start),
        renew: None,
    }
}

/// Renews the lease of `reservation` every third of `lease` until it is lost.
pub(super) async fn renew<St: Store>(
    store: &St,
    key: &str,
    reservation: &Reservation,
    lease: Duration,
    metrics: &Metrics,
) {
    let every = lease / 3;
    let mut next = tokio::time::Instant::now() + every;
    // Without Tokio's timer there is no heartbeat: the lease then lapses while the create
    // runs, which only matters to a layer that takes over abandoned keys.
    let Some(timer) = tokio_timer(next, "the lease of this create is not renewed") else {
        return;
    };
    let mut timer = std::pin::pin!(timer);
    loop {
        timer.as_mut().await;
        let started = Started::now();
        let renewed = store.renew(key, reservation, lease).await;
        metrics.store_call(Call::Renew, started);
        match renewed {
            Ok(()) => {}
            Err(error) if error.kind() == StoreErrorKind::ReservationLost => {
                tracing::error!(
                    "the reservation was taken over or resolved while its create ran; \
                     this create's response will not be stored"
                );
                return;
            }
            Err(error) => tracing::warn!(
                error = &error as &dyn std::error::Error,
                "renewing the lease failed"
            ),
        }
        // The next deadline ahead; past one a renewal took longer than a third of the
        // lease, skipped.
        let now = tokio::time::Instant::now();
        while next <= now {
            next += every;
        }
        timer.as_mut().reset(next);
    }
}

/// The renewals of one lease, boxed: made only for work that waits.
pub(super) type Renewals<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pin_project! {
    /// Polls `work` to its end, and the renewals beside it once `work` waited, until they
    /// end.
    pub(super) struct WhileRenewing<'a, F, S> {
        #[pin]
        work: F,
        // Makes the renewals, the first time `work` waits.
        start: Option<S>,
        renew: Option<Renewals<'a>>,
    }
}

impl<'a, F: Future, S: FnOnce() -> Renewals<'a>> Future for WhileRenewing<'a, F, S> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.work.poll(cx) {
            return Poll::Ready(output);
        }
        if let Some(start) = this.start.take() {
            *this.renew = Some(start());
        }
        if let Some(renew) = this.renew
            && renew.as_mut().poll(cx).is_ready()
        {
            *this.renew = None;
        }
        Poll::Pending
    }
}
pin_project! {
    /// A future that catches a panic of the function that makes it and of every poll, once:
    /// it ends with `None` and never polls the panicked future again.
    pub(crate) struct CatchUnwind<F> {
        #[pin]
        future: Option<F>,
    }
}

impl<F: Future> CatchUnwind<F> {
    pub(crate) fn new(make: impl FnOnce() -> F) -> Self {
        Self {
            future: panic::catch_unwind(AssertUnwindSafe(make)).ok(),
        }
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(future) = this.future.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        match panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Some(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => {
                this.future.set(None);
                Poll::Ready(None)
            }
        }
    }
}
