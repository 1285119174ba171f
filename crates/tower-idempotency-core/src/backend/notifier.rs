//! Waking the requests of this process that wait for a key, from the changes a remote store
//! announces to every replica: one listening connection per store, started by the first wait,
//! reconnected when lost, ended with the store.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;

use super::waiting::{self, WaiterMap, Waiters, Waiting};
use crate::{CHANGE_POLL_INTERVAL, DEFAULT_TIMEOUT};

/// How often a waiting request looks again while the store listens: only a change announced
/// while the listening connection was being replaced needs it.
pub const NOTIFIED_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How long the listener waits before it connects again after losing its connection, doubled
/// after each attempt that fails, up to [`MAX_RECONNECT_DELAY`].
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// The longest wait between two attempts to listen again.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(30);

/// The interval a waiter falls back on: slow while the store listens, short until it does.
pub fn poll_interval(listening: bool) -> Duration {
    if listening {
        NOTIFIED_POLL_INTERVAL
    } else {
        CHANGE_POLL_INTERVAL
    }
}

/// Where a store's announcements of changed keys come from.
pub trait Source: Clone + Send + Sync + 'static {
    /// A connection that listens.
    type Session: Send + 'static;

    /// Connects and starts listening; `None` when it cannot.
    fn listen(&self) -> impl Future<Output = Option<Self::Session>> + Send;

    /// The next changed key, as the store's waiters are registered under it; `None` when the
    /// connection is lost.
    fn poll_changed(session: &mut Self::Session, cx: &mut Context<'_>) -> Poll<Option<String>>;
}

/// The listening connection of a store and the requests waiting on it.
pub struct Notifier<S> {
    source: S,
    waiters: Mutex<WaiterMap>,
    /// Whether the listener task runs (started once, on the first wait).
    started: AtomicBool,
    /// Whether it listens now: waiters then rely on it, with a slow poll as a fallback.
    listening: AtomicBool,
    /// Notified when the notifier is dropped (the last clone of its store): the listener
    /// then ends.
    stop: Arc<Notify>,
}

impl<S> Drop for Notifier<S> {
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

impl<S: Source> Waiters for Arc<Notifier<S>> {
    fn with_waiters<R>(&self, _: &str, f: impl FnOnce(&mut WaiterMap) -> R) -> R {
        f(&mut self.waiters.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl<S: Source> Notifier<S> {
    /// A notifier of the announcements of `source`; its listener starts with the first wait.
    pub fn new(source: S) -> Arc<Self> {
        Arc::new(Self {
            source,
            waiters: Mutex::default(),
            started: AtomicBool::new(false),
            listening: AtomicBool::new(false),
            stop: Arc::default(),
        })
    }

    /// Whether the listener listens right now.
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// How many keys requests of this process wait on.
    pub fn waited_keys(&self) -> usize {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Registers a waiter of `key` (starting the listener if it does not run), and tells
    /// whether the listener listens: if it does, it wakes this waiter on the key's next
    /// announcement or when it stops listening.
    pub fn wait(self: &Arc<Self>, key: &str) -> (Waiting<Arc<Self>>, bool) {
        self.start();
        let waiting = waiting::wait(Arc::clone(self), key);
        // Read after the registration: a listener that stops from now on wakes this waiter
        // (it takes the whole map after clearing the flag), and one that stopped before
        // cleared the flag before this read.
        (waiting, self.listening())
    }

    /// Starts the listener, once, if there is a Tokio runtime to run it.
    fn start(self: &Arc<Self>) {
        if self.started.load(Ordering::Acquire) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current()
            && !self.started.swap(true, Ordering::AcqRel)
        {
            // Made here and moved into the task: a task dropped before its first poll (its
            // runtime shutting down) lets a later wait start the listener again.
            let restart = Restart(Arc::downgrade(self));
            runtime.spawn(listen(
                Arc::downgrade(self),
                Arc::clone(&self.stop),
                restart,
            ));
        }
    }
}

/// Listens for as long as the store lives, waking the waiters of each key announced;
/// reconnects after a lost connection, waking every waiter to look again (a change may have
/// been missed meanwhile).
async fn listen<S: Source>(notifier: Weak<Notifier<S>>, stop: Arc<Notify>, restart: Restart<S>) {
    let mut stopped = std::pin::pin!(stop.notified());
    // However it ends (its store dropped, its runtime shut down), a later wait starts it again.
    let _restart = restart;
    let mut delay = RECONNECT_DELAY;
    loop {
        let Some(source) = notifier.upgrade().map(|n| n.source.clone()) else {
            return;
        };
        if let Ok(Some(mut session)) = tokio::time::timeout(DEFAULT_TIMEOUT, source.listen()).await
        {
            set_listening(&notifier, true);
            delay = RECONNECT_DELAY;
            while let Some(key) = std::future::poll_fn(|cx| {
                if stopped.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                S::poll_changed(&mut session, cx)
            })
            .await
            {
                let Some(notifier) = notifier.upgrade() else {
                    return;
                };
                notifier.with_waiters(&key, |map| waiting::wake(map, &key));
            }
            set_listening(&notifier, false);
        } else if delay == RECONNECT_DELAY {
            tracing::warn!("cannot listen for the store's changes; waiting requests poll");
        }
        if notifier.strong_count() == 0 {
            return;
        }
        let mut pause = std::pin::pin!(tokio::time::sleep(delay));
        let store_dropped = std::future::poll_fn(|cx| {
            if stopped.as_mut().poll(cx).is_ready() {
                return Poll::Ready(true);
            }
            pause.as_mut().poll(cx).map(|()| false)
        })
        .await;
        if store_dropped {
            return;
        }
        delay = next_delay(delay);
    }
}

/// The pause after `delay` when another attempt to listen failed: doubled, up to
/// [`MAX_RECONNECT_DELAY`].
fn next_delay(delay: Duration) -> Duration {
    delay.saturating_mul(2).min(MAX_RECONNECT_DELAY)
}

/// Marks a notifier's listener as ended when its task ends, however it ends.
struct Restart<S: Source>(Weak<Notifier<S>>);

impl<S: Source> Drop for Restart<S> {
    fn drop(&mut self) {
        set_listening(&self.0, false);
        if let Some(notifier) = self.0.upgrade() {
            notifier.started.store(false, Ordering::Release);
        }
    }
}

/// Records whether the listener listens; when it stops, every waiter looks again.
fn set_listening<S: Source>(notifier: &Weak<Notifier<S>>, listening: bool) {
    if let Some(notifier) = notifier.upgrade() {
        notifier.listening.store(listening, Ordering::Release);
        if !listening {
            let waiters = std::mem::take(
                &mut *notifier
                    .waiters
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            for waiter in waiters.into_values() {
                waiter.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_between_attempts_doubles_up_to_its_cap() {
        assert_eq!(next_delay(RECONNECT_DELAY), Duration::from_secs(1));
        assert_eq!(next_delay(Duration::from_secs(1)), Duration::from_secs(2));
        assert_eq!(next_delay(Duration::from_secs(20)), MAX_RECONNECT_DELAY);
        assert_eq!(next_delay(MAX_RECONNECT_DELAY), MAX_RECONNECT_DELAY);
    }
}
