//! Requests waiting for a key to change ([`Store::changed`](crate::Store::changed)): one
//! `Notify` per waited key in a map the store keeps, woken and removed on a change, removed by
//! the last waiter that gives up, so waiting leaves nothing behind.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// The waiters of some keys, by key. Touch it only through [`wait`] and [`wake`]: a waiter
/// that gives up removes its key's entry when it holds the entry's last reference beside the
/// map's, so a clone of an entry's `Notify` kept elsewhere would leave the entry behind.
pub type WaiterMap = HashMap<Box<str>, Arc<Notify>>;

/// Where a store keeps the waiter map of a key, behind its lock.
pub trait Waiters: Send + Sync + Unpin + 'static {
    /// Runs `f` on the map that holds `key`'s waiters, under its lock.
    fn with_waiters<R>(&self, key: &str, f: impl FnOnce(&mut WaiterMap) -> R) -> R;
}

/// One map for every key, behind one lock: a store whose waiters are this process's alone.
impl Waiters for Arc<std::sync::Mutex<WaiterMap>> {
    fn with_waiters<R>(&self, _: &str, f: impl FnOnce(&mut WaiterMap) -> R) -> R {
        f(&mut self
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// Wakes and forgets the waiters of `key` in `map`, if any.
pub fn wake(map: &mut WaiterMap, key: &str) {
    // Nobody waits, mostly: not even the key's hash is worth computing then.
    if map.is_empty() {
        return;
    }
    if let Some(waiters) = map.remove(key) {
        waiters.notify_waiters();
    }
}

/// Registers a waiter of `key`: the future ends at the next [`wake`] of the key, and sees
/// every wake made after this call, polled or not.
pub fn wait<W: Waiters>(waiters: W, key: &str) -> Waiting<W> {
    let (notify, notified) = waiters.with_waiters(key, |map| {
        let notify = Arc::clone(map.entry(key.into()).or_default());
        // Made under the lock: no wake can come between the entry and the registration.
        let notified = Arc::clone(&notify).notified_owned();
        (notify, notified)
    });
    Waiting {
        notified: Some(Box::pin(notified)),
        waiters,
        key: key.into(),
        notify: Some(notify),
    }
}

/// One waiter of a key.
pub struct Waiting<W: Waiters> {
    notified: Option<Pin<Box<OwnedNotified>>>,
    waiters: W,
    key: Box<str>,
    /// This waiter's hold on the key's entry; let go under the map's lock.
    notify: Option<Arc<Notify>>,
}

impl<W: Waiters> Future for Waiting<W> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut().notified.as_mut() {
            Some(notified) => notified.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl<W: Waiters> Drop for Waiting<W> {
    fn drop(&mut self) {
        drop(self.notified.take());
        let Some(notify) = self.notify.take() else {
            return;
        };
        let key = &self.key;
        self.waiters.with_waiters(key, |map| {
            // Still this key's entry, and no other waiter holds it: the map's hold and this
            // one's. Every waiter lets go under the lock, so the count is exact here.
            let last = map.get(key).is_some_and(|current| {
                Arc::ptr_eq(current, &notify) && Arc::strong_count(&notify) == 2
            });
            if last {
                map.remove(key);
            }
            drop(notify);
        });
    }
}

/// Ends at the wake of `waiting`, if any, or after `every`.
pub async fn until<W: Waiters>(waiting: Option<Waiting<W>>, every: Duration) {
    let mut poll = std::pin::pin!(tokio::time::sleep(every));
    let mut waiting = waiting;
    std::future::poll_fn(|cx| {
        if poll.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        match waiting.as_mut() {
            Some(waiting) => Pin::new(waiting).poll(cx),
            None => Poll::Pending,
        }
    })
    .await;
}
