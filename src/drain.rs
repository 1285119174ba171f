//! The layer's graceful shutdown ([`Drain`]).

use std::fmt;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The shutdown handle of one or more layers, given with [`IdempotencyLayer::drain`]: counts
/// the requests past their claim and, once closed, refuses new claims.
///
/// [`Drain`]: a graceful shutdown that strands no key. The creates in flight run to their
/// complete; nothing new is claimed meanwhile.
///
/// A server that stops while creates run, as on a deploy's `SIGTERM`, would leave each of their
/// keys pending until its lease lapses or an operator acts, and every retry meanwhile would get
/// `409`. With a drain on the layer, on the signal a server closes the drain with
/// [`Drain::close`] and starts its own graceful shutdown: it stops accepting connections and
/// lets those open finish their requests. Every request already past its claim runs its create
/// and its complete. A request that still arrives, on a connection kept open or to a server
/// that still accepts, is refused before its claim with the operation's *store unavailable*
/// answer, a `503` with `Retry-After`, which a client retries elsewhere or later. The server's
/// graceful shutdown has no deadline of its own: bound it, then wait with [`Drain::shutdown`]
/// for the work that outlives its connection, within what is left of the deadline. Such work is
/// a create whose client left, or a lost store answer being settled.
///
/// With axum, as the example servers do on `SIGTERM` and Ctrl-C:
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::layer::Drain;
/// use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};
///
/// # async fn create() -> &'static str { "" }
/// # async fn run(signal: impl std::future::Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
/// let drain = Drain::new();
/// let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new())
///     .global_keys()
///     .drain(&drain);
/// let app = axum::Router::new().route("/payments", axum::routing::post(create).route_layer(layer));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
/// let closing = drain.clone();
/// let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
///     signal.await; // SIGTERM
///     closing.close();
/// });
/// let deadline = Duration::from_secs(30);
/// let started = tokio::time::Instant::now();
/// tokio::select! {
///     served = serve => served?,
///     () = async { drain.closed().await; tokio::time::sleep(deadline).await } => {}
/// }
/// match drain.shutdown(deadline.saturating_sub(started.elapsed())).await {
///     Ok(()) => println!("every create in flight completed"),
///     Err(unfinished) => eprintln!("{unfinished}"),
/// }
/// # Ok(()) }
/// ```
///
/// Cloning it shares it. A layer without a drain pays nothing for it; one with a drain pays
/// two atomic operations a request that reaches its claim.
///
/// [`IdempotencyLayer::drain`]: crate::IdempotencyLayer::drain
#[derive(Clone, Default)]
pub struct Drain {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    closed: AtomicBool,
    in_flight: AtomicUsize,
    /// Woken when the last request in flight ends after the drain closed.
    idle: Notify,
    /// Woken when the drain closes.
    closing: Notify,
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("closed", &self.is_closed())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// The requests still in flight when [`Drain::shutdown`]'s deadline passed: their keys are
/// left pending, as a crash would leave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// Requests past their claim and not yet completed or released.
    pub in_flight: usize,
}

impl fmt::Display for Unfinished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} request(s) still in flight at the drain's deadline; their keys stay pending",
            self.in_flight
        )
    }
}

impl std::error::Error for Unfinished {}

impl Drain {
    /// A drain that is open: requests claim as usual.
    ///
    /// ```
    /// let drain = tower_idempotency::layer::Drain::new();
    /// assert!(!drain.is_closed());
    /// assert_eq!(drain.in_flight(), 0);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops new claims: from now on a request that reaches its claim is refused with the
    /// operation's *store unavailable* answer, a `503` with `Retry-After`. Requests past their
    /// claim go on. Calling it again does nothing.
    ///
    /// ```
    /// let drain = tower_idempotency::layer::Drain::new();
    /// drain.close();
    /// assert!(drain.is_closed());
    /// ```
    pub fn close(&self) {
        if !self.inner.closed.swap(true, Ordering::SeqCst) {
            self.inner.closing.notify_waiters();
        }
    }

    /// Whether [`close`](Self::close) or [`shutdown`](Self::shutdown) was called.
    ///
    /// ```
    /// assert!(!tower_idempotency::layer::Drain::new().is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// Requests past their claim and not yet done: each holds a key until its complete or
    /// release.
    ///
    /// ```
    /// assert_eq!(tower_idempotency::layer::Drain::new().in_flight(), 0);
    /// ```
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// Ends once the drain is closed: a place to start a server's own graceful shutdown from.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let drain = tower_idempotency::layer::Drain::new();
    /// drain.close();
    /// drain.closed().await;
    /// # }
    /// ```
    pub async fn closed(&self) {
        let mut notified = pin!(self.inner.closing.notified());
        notified.as_mut().enable();
        if self.is_closed() {
            return;
        }
        notified.await;
    }

    /// Closes the drain, then waits until every request past its claim completed or released,
    /// at most `deadline`.
    ///
    /// # Errors
    ///
    /// [`Unfinished`] if requests were still in flight at the deadline.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    ///
    /// let drain = tower_idempotency::layer::Drain::new();
    /// assert_eq!(drain.shutdown(Duration::from_secs(1)).await, Ok(()));
    /// assert!(drain.is_closed());
    /// # }
    /// ```
    pub async fn shutdown(&self, deadline: Duration) -> Result<(), Unfinished> {
        self.close();
        let now = tokio::time::Instant::now();
        // A deadline past what the clock can add is no deadline.
        let until = now.checked_add(deadline);
        loop {
            let mut idle = pin!(self.inner.idle.notified());
            idle.as_mut().enable();
            let in_flight = self.in_flight();
            if in_flight == 0 {
                return Ok(());
            }
            let Some(until) = until else {
                idle.await;
                continue;
            };
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return match self.in_flight() {
                    0 => Ok(()),
                    in_flight => Err(Unfinished { in_flight }),
                };
            }
        }
    }

    /// Work that finishes what a request began, such as settling a lost store answer or
    /// abandoning an unfinished create. It is counted until the returned guard is dropped,
    /// closed or not, so that a shutdown waits for it too.
    pub(crate) fn hold(&self) -> InFlight {
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(&self.inner))
    }

    /// A request about to claim: counted until the returned guard is dropped, or `None` if the
    /// drain is closed. Counted first and checked second, so that a shutdown that saw no
    /// request in flight is never followed by a claim.
    pub(crate) fn enter(&self) -> Option<InFlight> {
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let entered = InFlight(Arc::clone(&self.inner));
        if self.is_closed() {
            return None;
        }
        Some(entered)
    }
}

/// One request past its claim, counted by its [`Drain`] while it lives.
pub(crate) struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.closed.load(Ordering::SeqCst)
        {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_the_last_request_and_no_longer() {
        let drain = Drain::new();
        let first = drain.enter().expect("open");
        let second = drain.enter().expect("open");
        assert_eq!(drain.in_flight(), 2);
        let waiting = tokio::spawn({
            let drain = drain.clone();
            async move { drain.shutdown(Duration::from_secs(10)).await }
        });
        drain.closed().await;
        assert!(drain.enter().is_none(), "closed: no new claim");
        assert_eq!(drain.in_flight(), 2, "a refused request is not counted");
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(second);
        assert_eq!(waiting.await.unwrap(), Ok(()));
        assert_eq!(drain.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_gives_up_at_its_deadline() {
        let drain = Drain::new();
        let held = drain.enter().expect("open");
        let started = tokio::time::Instant::now();
        assert_eq!(
            drain.shutdown(Duration::from_secs(3)).await,
            Err(Unfinished { in_flight: 1 })
        );
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        drop(held);
        assert_eq!(drain.shutdown(Duration::ZERO).await, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn work_held_after_the_close_is_waited_for_and_any_deadline_is_taken() {
        let drain = Drain::new();
        drain.close();
        let held = drain.hold();
        assert_eq!(drain.in_flight(), 1);
        let waiting = tokio::spawn({
            let drain = drain.clone();
            async move { drain.shutdown(Duration::MAX).await }
        });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!waiting.is_finished());
        drop(held);
        assert_eq!(waiting.await.unwrap(), Ok(()));
    }

    #[test]
    fn an_open_drain_counts_and_uncounts() {
        let drain = Drain::new();
        assert!(!drain.is_closed());
        let entered = drain.enter();
        assert_eq!(drain.in_flight(), 1);
        drop(entered);
        assert_eq!(drain.in_flight(), 0);
        drain.close();
        drain.close();
        assert!(drain.is_closed());
    }
}
