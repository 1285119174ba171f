//! What a run answers: the value ([`Ran`]), or why there is none ([`RunError`]); and what a
//! failed run does with its key ([`Failures`]).

use std::fmt;

/// The value of a run: computed now, or the stored value of the run that completed the key.
///
/// A consumer acknowledges its message on any of the three: the work was done, by this run or
/// an earlier one.
///
/// ```
/// use tower_idempotency::idempotent::Ran;
///
/// let ran = Ran::Replayed(7);
/// assert!(ran.is_replayed() && ran.is_stored());
/// assert_eq!(ran.into_inner(), 7);
/// assert!(!Ran::Unrecorded(7).is_stored());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran<T> {
    /// The work ran now, and its value was stored with the key.
    Done(T),
    /// The key was completed before: its stored value, the work not run.
    Replayed(T),
    /// The work ran now, but its value may not be stored: the store's complete failed. Where
    /// the complete's outcome is unknown (a timeout, a connection lost), it may have been
    /// stored, and the complete is repeated in the background until the store answers; where
    /// it is known to have failed (the key was taken over while the work ran, its lease having
    /// lapsed), it is not, and another run's value may be the stored one. Not on a transactional store, whose work is undone with a
    /// complete that fails ([`RunError::StoreUnavailable`]).
    Unrecorded(T),
}

impl<T> Ran<T> {
    /// The value, computed now or replayed.
    pub fn into_inner(self) -> T {
        match self {
            Self::Done(value) | Self::Replayed(value) | Self::Unrecorded(value) => value,
        }
    }

    /// Whether the value is known to be the one the store holds for the key: done and stored,
    /// or replayed (not [`Unrecorded`](Self::Unrecorded), whose value may or may not be).
    pub fn is_stored(&self) -> bool {
        !matches!(self, Self::Unrecorded(_))
    }

    /// Whether the value is a replay: the work did not run.
    pub fn is_replayed(&self) -> bool {
        matches!(self, Self::Replayed(_))
    }
}

/// Why a run has no value.
///
/// [`Pending`](Self::Pending), [`StoreUnavailable`](Self::StoreUnavailable) and
/// [`Unknown`](Self::Unknown) ask to try again later with the same key
/// ([`is_transient`](Self::is_transient)): a message consumer leaves its message
/// unacknowledged, so that the broker delivers it again. [`Conflict`](Self::Conflict) and
/// [`InvalidKey`](Self::InvalidKey) are the message's own fault: no retry changes them.
/// [`Unstorable`](Self::Unstorable) and [`Undecodable`](Self::Undecodable) are a bug in the
/// value's type: set the message aside for a person.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError<E> {
    /// The key is not 1 to 255 visible ASCII characters; the store was not asked.
    InvalidKey,
    /// The key belongs to a run with another fingerprint: another operation under the same key.
    Conflict,
    /// The key's run completed and the store's replay window passed: its value is gone, and
    /// what the store remembers of it is this [`Tombstone`](crate::store::Tombstone). The
    /// work ran once, and does not run again under this key (final: not transient).
    Expired(crate::store::Tombstone),
    /// Another attempt holds the key and runs the work (or ran it and failed, under
    /// [`Failures::Keep`]); with a [pending wait](super::Idempotent::pending_wait), it did not
    /// finish within it.
    Pending,
    /// The store did not answer, or the transaction of a transactional store did not commit:
    /// nothing of the work remains (or, for a claim, the work did not run).
    StoreUnavailable,
    /// The work ran and the transaction of a transactional store was sent its `COMMIT`, whose
    /// answer was lost: the work's writes and its stored value may have committed, or not.
    /// Run again with the same key to learn which: a replay if they did, a new run if not.
    /// Neither compensate nor dead-letter on it.
    Unknown,
    /// The work returned this error; the key was released or kept, as [`Failures`] says.
    Failed(E),
    /// The work panicked; the key was released or kept, as [`Failures`] says.
    Panicked,
    /// The work's value could not be written as JSON (`serde_json`'s error): the work ran, the
    /// key stays taken.
    Unstorable(serde_json::Error),
    /// The stored value of the key could not be read as the value asked for (`serde_json`'s
    /// error).
    Undecodable(serde_json::Error),
}

impl<E> RunError<E> {
    /// Whether the same run may succeed later with the same key: [`Pending`](Self::Pending),
    /// [`StoreUnavailable`](Self::StoreUnavailable) and [`Unknown`](Self::Unknown).
    ///
    /// ```
    /// use tower_idempotency::idempotent::RunError;
    ///
    /// assert!(RunError::<()>::Pending.is_transient());
    /// assert!(!RunError::<()>::Conflict.is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Pending | Self::StoreUnavailable | Self::Unknown)
    }
}

impl<E: fmt::Display> fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidKey => f.write_str("the key is not 1 to 255 visible ASCII characters"),
            Self::Conflict => f.write_str("the key was used with another fingerprint"),
            Self::Expired(_) => f.write_str(
                "the key's run completed and its replay window passed: it is not run again",
            ),
            Self::Pending => f.write_str("another attempt holds the key"),
            Self::StoreUnavailable => f.write_str("the store is unavailable; nothing was done"),
            Self::Unknown => f.write_str(
                "the commit went unanswered: the work may have been committed; run again with \
                 the same key to learn which",
            ),
            Self::Failed(error) => write!(f, "the work failed: {error}"),
            Self::Panicked => f.write_str("the work panicked"),
            Self::Unstorable(error) => write!(f, "the work's value cannot be stored: {error}"),
            Self::Undecodable(error) => write!(f, "the stored value cannot be read: {error}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RunError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Failed(error) => Some(error),
            Self::Unstorable(error) | Self::Undecodable(error) => Some(error),
            _ => None,
        }
    }
}

/// What a run whose work failed (returned an error, or panicked) does with its key.
///
/// The default keeps it, as the layer keeps the key of a create that failed: the work may have
/// had an effect before it failed. A transactional store frees the key either way, since the
/// work's writes are rolled back with it.
///
/// ```
/// use tower_idempotency::idempotent::Failures;
///
/// assert_eq!(Failures::default(), Failures::Keep);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Failures {
    /// The key stays taken: later runs answer [`RunError::Pending`] until an operator resolves
    /// it, or its lease lapses and a run that [takes over](super::Idempotent::take_over_abandoned)
    /// runs the work again.
    #[default]
    Keep,
    /// The key is released: the next run runs the work again. For work whose failure provably
    /// leaves no effect. To store a failure as the answer instead, return it in the value
    /// (`Ok(Err(…))`, with a `Result` as the value type).
    Release,
}
