//! The function API ([`Idempotent`]) on the store: a run done once and replayed, a conflict,
//! a pending key answered at once or waited for, a lapsed lease taken over only when asked,
//! lost store answers settled, failed and panicking work kept or released.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::unique_key;
use crate::idempotent::{Failures, Idempotent, Ran, RunError, fingerprint};
use crate::operation::Fingerprint;
use crate::store::Store;
use crate::store::{StoreError, StoreErrorKind};
use crate::testing::wrapped::{Around, Wrapped};

/// The fingerprint of a message sent to parcel `parcel`.
fn message(parcel: &str) -> Fingerprint {
    fingerprint(&serde_json::json!({ "parcel_id": parcel })).expect("a JSON value")
}

/// A run of `idempotent` under `key` whose work counts itself in `runs` and answers `value`.
async fn counted<St: Store>(
    idempotent: &Idempotent<St>,
    key: &str,
    parcel: &str,
    runs: &AtomicUsize,
    value: &str,
) -> Result<Ran<String>, RunError<String>> {
    idempotent
        .run(key, message(parcel), |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(value.to_owned())
        })
        .await
}

/// Runs `attempt` until it answers other than pending, for at most ten seconds.
async fn until_not_pending<T, Fut: Future<Output = Result<Ran<T>, RunError<String>>>>(
    mut attempt: impl FnMut() -> Fut,
) -> Result<Ran<T>, RunError<String>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match attempt().await {
            Err(RunError::Pending | RunError::StoreUnavailable)
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answer => return answer,
        }
    }
}

/// A run's work runs once: the first run is done, every later run with its key replays its
/// value without running the work; the same key in another scope is another operation.
pub async fn a_run_is_done_once_then_replayed(store: impl Store) {
    let labels = Idempotent::new(store.clone()).scope("labels");
    let (key, runs) = (unique_key("run-once"), AtomicUsize::new(0));
    let first = counted(&labels, &key, "parcel-42", &runs, "label-1").await;
    assert_eq!(first.unwrap(), Ran::Done("label-1".to_owned()));
    for _ in 0..3 {
        let again = counted(&labels, &key, "parcel-42", &runs, "label-2").await;
        assert_eq!(again.unwrap(), Ran::Replayed("label-1".to_owned()));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let invoices = Idempotent::new(store).scope("invoices");
    let other = counted(&invoices, &key, "parcel-42", &runs, "invoice-1").await;
    assert_eq!(other.unwrap(), Ran::Done("invoice-1".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Another fingerprint under a key, pending or completed, is a conflict: nothing runs.
pub async fn a_run_with_another_fingerprint_conflicts(store: impl Store) {
    let labels = Idempotent::new(store).scope("labels");
    let (key, runs) = (unique_key("run-conflict"), AtomicUsize::new(0));
    counted(&labels, &key, "parcel-42", &runs, "label-1")
        .await
        .unwrap();
    let other = counted(&labels, &key, "parcel-43", &runs, "label-2").await;
    assert!(matches!(other, Err(RunError::Conflict)), "{other:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// While a run's work runs, another run with its key is pending at once, or, with a pending
/// wait, answers the first run's value once it is stored; neither runs the work.
pub async fn a_run_while_another_runs_is_pending_or_waits(store: impl Store) {
    let labels = Idempotent::new(store).scope("labels");
    let key = unique_key("run-pending");
    let (started, finish) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let first = tokio::spawn({
        let (labels, key) = (labels.clone(), key.clone());
        let (started, finish) = (Arc::clone(&started), Arc::clone(&finish));
        async move {
            labels
                .run(&key, message("parcel-42"), |_| async move {
                    started.notify_one();
                    finish.notified().await;
                    Ok::<_, String>("label-1".to_owned())
                })
                .await
        }
    });
    started.notified().await;
    let runs = AtomicUsize::new(0);
    let pending = counted(&labels, &key, "parcel-42", &runs, "label-2").await;
    assert!(matches!(pending, Err(RunError::Pending)), "{pending:?}");
    let waiting = tokio::spawn({
        let (labels, key) = (labels.pending_wait(Duration::from_secs(30)), key.clone());
        async move {
            labels
                .run(&key, message("parcel-42"), |_| async {
                    Err::<String, _>("the waiting run ran the work".to_owned())
                })
                .await
        }
    });
    finish.notify_one();
    assert_eq!(
        first.await.expect("the first run").unwrap(),
        Ran::Done("label-1".to_owned())
    );
    assert_eq!(
        waiting.await.expect("the waiting run").unwrap(),
        Ran::Replayed("label-1".to_owned())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A run whose holder stopped (its future dropped mid-work, as a crashed worker's) keeps its
/// key pending; once its lease lapsed, a run that takes over runs the work (both runs taking
/// over, as the store's claim asks), one that does not stays pending.
pub async fn a_lapsed_run_is_taken_over_only_when_asked(store: impl Store) {
    let lease = Duration::from_millis(200);
    let taking = Idempotent::new(store)
        .scope("labels")
        .lease(lease)
        .take_over_abandoned();
    let key = unique_key("run-lapse");
    let started = Arc::new(tokio::sync::Notify::new());
    let crashed = tokio::spawn({
        let (taking, key, started) = (taking.clone(), key.clone(), Arc::clone(&started));
        async move {
            taking
                .run(&key, message("parcel-42"), |_| async move {
                    started.notify_one();
                    std::future::pending::<Result<String, String>>().await
                })
                .await
        }
    });
    started.notified().await;
    crashed.abort();
    let _ = crashed.await;
    // Past the lapse, whatever the store's clock granularity.
    tokio::time::sleep(lease * 3).await;
    let runs = AtomicUsize::new(0);
    let keeping = Idempotent::new(taking.store().clone())
        .scope("labels")
        .lease(lease);
    let kept = counted(&keeping, &key, "parcel-42", &runs, "label-2").await;
    assert!(matches!(kept, Err(RunError::Pending)), "{kept:?}");
    let taken = until_not_pending(|| counted(&taking, &key, "parcel-42", &runs, "label-2")).await;
    assert_eq!(taken.unwrap(), Ran::Done("label-2".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A claim whose answer is lost ran nothing and is settled (the key free again); a complete
/// whose answer is lost answers the value as unrecorded and is settled (the key completed,
/// then replayed).
pub async fn lost_run_answers_are_settled(store: impl Store) {
    let losing = Losing::new(store);
    let labels = Idempotent::new(losing.clone()).scope("labels");
    let runs = AtomicUsize::new(0);

    let key = unique_key("run-lost-claim");
    losing.lose("claim");
    let lost = counted(&labels, &key, "parcel-42", &runs, "label-1").await;
    assert!(matches!(lost, Err(RunError::StoreUnavailable)), "{lost:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let settled = until_not_pending(|| counted(&labels, &key, "parcel-42", &runs, "label-1")).await;
    assert_eq!(settled.unwrap(), Ran::Done("label-1".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let key = unique_key("run-lost-complete");
    losing.lose("complete");
    let done = counted(&labels, &key, "parcel-42", &runs, "label-2").await;
    assert_eq!(done.unwrap(), Ran::Unrecorded("label-2".to_owned()));
    let replayed =
        until_not_pending(|| counted(&labels, &key, "parcel-42", &runs, "label-3")).await;
    assert_eq!(replayed.unwrap(), Ran::Replayed("label-2".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A claim no replica confirmed in time: the store undid it on the primary, but a replica
    // may hold it, and be promoted; it is settled as a lost claim is (the key free again).
    let key = unique_key("run-unreplicated-claim");
    losing.lose_as("claim", StoreErrorKind::Unreplicated);
    let refused = counted(&labels, &key, "parcel-42", &runs, "label-4").await;
    assert!(
        matches!(refused, Err(RunError::StoreUnavailable)),
        "{refused:?}"
    );
    let settled = until_not_pending(|| counted(&labels, &key, "parcel-42", &runs, "label-4")).await;
    assert_eq!(settled.unwrap(), Ran::Done("label-4".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// Work that fails or panics answers so; under [`Failures::Keep`] its key stays pending, under
/// [`Failures::Release`] the next run runs the work.
pub async fn failed_and_panicking_runs_keep_or_release_their_key(store: impl Store) {
    let runs = AtomicUsize::new(0);
    for failures in [Failures::Keep, Failures::Release] {
        let labels = Idempotent::new(store.clone())
            .scope("labels")
            .on_failure(failures);
        let failed_key = unique_key("run-failed");
        let failed = labels
            .run(&failed_key, message("parcel-42"), |_| async {
                Err::<String, _>("no label printer".to_owned())
            })
            .await;
        assert!(
            matches!(&failed, Err(RunError::Failed(error)) if error == "no label printer"),
            "{failed:?}"
        );
        let panicked_key = unique_key("run-panicked");
        let panicked = labels
            .run(&panicked_key, message("parcel-42"), |_| on_fire())
            .await;
        assert!(matches!(panicked, Err(RunError::Panicked)), "{panicked:?}");
        for key in [&failed_key, &panicked_key] {
            let next = counted(&labels, key, "parcel-42", &runs, "label-1").await;
            match failures {
                Failures::Keep => assert!(matches!(next, Err(RunError::Pending)), "{next:?}"),
                Failures::Release => assert_eq!(next.unwrap(), Ran::Done("label-1".to_owned())),
            }
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Work that panics.
async fn on_fire() -> Result<String, String> {
    panic!("the label printer caught fire")
}

/// A store that loses the answer of the next call named: the call takes effect, its caller
/// gets [`StoreErrorKind::Unavailable`] (or the kind given).
type Losing<St> = Wrapped<St, Loses>;

/// The call whose answer is lost next, if any, and the error its caller gets.
#[derive(Clone, Default)]
struct Loses(Arc<Mutex<Option<(&'static str, StoreErrorKind)>>>);

impl<St> Losing<St> {
    fn new(inner: St) -> Self {
        let around = Loses::default();
        Self { inner, around }
    }

    fn lose(&self, call: &'static str) {
        self.lose_as(call, StoreErrorKind::Unavailable);
    }

    fn lose_as(&self, call: &'static str, kind: StoreErrorKind) {
        *self.around.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((call, kind));
    }
}

impl Around for Loses {
    /// The call's answer, unless it is the answer to lose.
    async fn around<'a, T: Send + 'a>(
        &'a self,
        call: &'static str,
        run: impl Future<Output = Result<T, StoreError>> + Send + 'a,
    ) -> Result<T, StoreError> {
        let answer = run.await;
        let mut next = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((lost, kind)) = *next
            && lost == call
        {
            *next = None;
            return Err(StoreError::new(kind));
        }
        answer
    }
}
