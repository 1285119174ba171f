//! What every transactional store shows, written once over the database each file gives
//! ([`TxDb`]): the record and the create's row commit together, a failed create leaves
//! nothing, an admission refusal rolls the claim back, a second attempt is pending at once,
//! replays and conflicts never wait, a response over the cap commits compact, and a server
//! error rolls back by default. `transactional_cases!(Db)` in a database's file runs them there.
#![cfg(any(feature = "postgres", feature = "mysql"))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::admission::{Admit, Refusal, admit_fn};
use tower_idempotency::layer::{Idempotency, RequestBody, StoredResponses};
use tower_idempotency::operation::{LabelContract, LabelOperation};
use tower_idempotency::reply::Outcome;
use tower_idempotency::scope::store_key;
use tower_idempotency::store::{Operator, Store};

use crate::common::{Chunks, Reply, operation};

/// The create a database's file writes: it inserts its label in the claim's transaction, then
/// does what its parcel says (`ok`, `fail`, `panic`, `slow` for two seconds, `server-error`,
/// `client-error`, and the database's own cases).
pub(crate) type Create = tower::util::BoxCloneSyncService<
    Request<RequestBody<Chunks>>,
    Response<Full<Bytes>>,
    std::io::Error,
>;

/// A transactional store on tables of the test's own: its records, and the labels its
/// creates insert.
pub(crate) trait TxDb: Sized {
    /// The transactional store.
    type Store: Store + Operator + Clone + Send + Sync + 'static;

    /// The tables named after `name`, made afresh.
    async fn make(name: &str) -> Self;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// Transactions open now.
    fn open_transactions(&self) -> usize;

    /// The label rows of `request_id`, committed.
    async fn rows(&self, request_id: &str) -> i64;

    /// Whether the record of `request_id` exists, committed.
    async fn recorded(&self, request_id: &str) -> bool {
        let key = store_key(None, &http::Method::POST, "/labels", request_id);
        self.store().inspect(&key).await.unwrap().is_some()
    }

    /// The create, on this database's labels.
    fn create(&self) -> Create;

    /// The layer over [`TxDb::create`] on this store.
    fn service(&self) -> Idempotency<Create, Self::Store, LabelContract> {
        IdempotencyLayer::new(self.store().clone(), LabelContract)
            .global_keys()
            // The create reads the operation from the request extensions.
            .value_extension(true)
            .layer(self.create())
    }

    /// Waits until a create holds a transaction open.
    async fn one_open(&self, first: &tokio::task::JoinHandle<Reply>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.open_transactions() == 0 {
            assert!(!first.is_finished(), "the attempt ended before its create");
            assert!(Instant::now() < deadline, "the attempt never claimed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The request of `request_id` for `parcel`, sent to `service`, its reply read whole.
pub(crate) async fn send<S>(service: &S, request_id: &str, parcel: &str) -> Reply
where
    S: tower::Service<
            Request<Chunks>,
            Response = Response<tower_idempotency::layer::ResponseBody<Full<Bytes>>>,
            Error = std::io::Error,
        > + Clone,
{
    let response = service
        .clone()
        .oneshot(operation(request_id, parcel))
        .await
        .unwrap();
    Reply::read(response).await
}

pub(crate) async fn the_record_and_the_creates_row_commit_together_and_replay<D: TxDb>() {
    let db = D::make("commit").await;
    let service = db.service();
    let first = send(&service, "t-1", "ok").await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(db.rows("t-1").await, 1);
    assert!(db.recorded("t-1").await);
    let replay = send(&service, "t-1", "ok").await;
    assert_eq!((replay.status, &replay.body), (first.status, &first.body));
    assert_eq!(db.rows("t-1").await, 1);
    assert_eq!(db.open_transactions(), 0);
}

pub(crate) async fn a_create_that_fails_or_panics_leaves_no_row_and_a_free_key<D: TxDb>() {
    let db = D::make("fail").await;
    let service = db.service();
    for (request_id, how) in [("f-1", "fail"), ("f-2", "panic")] {
        let failed = send(&service, request_id, how).await;
        assert_eq!(failed.status, 500, "{how}: {:?}", failed.body);
        assert_eq!(db.rows(request_id).await, 0, "{how}: rolled back");
        assert!(!db.recorded(request_id).await, "{how}: the key is free");
        assert_eq!(db.open_transactions(), 0);
    }
    // The same operation again (another parcel would conflict, were anything recorded).
    let retry = send(&service, "f-1", "ok").await;
    assert_eq!(retry.status, 201);
    assert_eq!(db.rows("f-1").await, 1);
}

pub(crate) async fn an_admission_refusal_rolls_the_claim_back<D: TxDb>() {
    let db = D::make("admit").await;
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = refuse.clone();
    let admission = admit_fn(move |_: &LabelOperation| {
        let refused = flag.load(std::sync::atomic::Ordering::SeqCst);
        async move {
            if refused {
                Admit::Refuse(Refusal::TooManyRequests)
            } else {
                Admit::Proceed(())
            }
        }
    });
    let service = IdempotencyLayer::new(db.store().clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .admission(admission)
        .layer(db.create());
    let refused = send(&service, "a-1", "ok").await;
    assert_eq!(refused.status, 429);
    assert!(!db.recorded("a-1").await);
    assert_eq!(db.open_transactions(), 0);
    refuse.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(send(&service, "a-1", "ok").await.status, 201);
}

pub(crate) async fn a_second_attempt_while_the_first_is_open_is_pending_at_once<D: TxDb>() {
    let db = D::make("pending").await;
    let service = db.service();
    let first = {
        let service = service.clone();
        tokio::spawn(async move { send(&service, "p-1", "slow").await })
    };
    // The first claims, then creates for two seconds in its open transaction.
    db.one_open(&first).await;
    let asked = Instant::now();
    let pending = send(&service, "p-1", "slow").await;
    assert_eq!(pending.status, 409, "{:?}", pending.body);
    assert!(
        std::str::from_utf8(&pending.body)
            .unwrap()
            .contains("request_pending")
    );
    assert!(
        asked.elapsed() < Duration::from_millis(900),
        "not blocked on the open row"
    );
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    let replay = send(&service, "p-1", "slow").await;
    assert_eq!(replay.body, first.body);
    assert_eq!(db.rows("p-1").await, 1);
}

pub(crate) async fn concurrent_replays_and_conflicts_of_a_completed_key_are_never_pending<
    D: TxDb,
>() {
    let db = D::make("replays").await;
    let service = db.service();
    let first = send(&service, "r-1", "ok").await;
    assert_eq!(first.status, 201);
    let replays: Vec<_> = (0..50)
        .map(|i| {
            let service = service.clone();
            let parcel = if i % 5 == 0 { "other" } else { "ok" };
            tokio::spawn(async move { (parcel, send(&service, "r-1", parcel).await) })
        })
        .collect();
    for replay in replays {
        let (parcel, reply) = replay.await.unwrap();
        if parcel == "ok" {
            assert_eq!((reply.status.as_u16(), &reply.body), (201, &first.body));
        } else {
            assert_eq!(
                (reply.status.as_u16(), &reply.body[..]),
                (409, &br#"{"error":"idempotency_conflict"}"#[..])
            );
        }
    }
}

pub(crate) async fn a_response_over_the_cap_commits_with_its_compact_record<D: TxDb>() {
    let db = D::make("cap").await;
    let service = IdempotencyLayer::new(db.store().clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .response_limit(4)
        .layer(db.create());
    let over = send(&service, "c-1", "ok").await;
    assert_eq!(over.status, 201, "{:?}", over.body);
    assert_eq!(&over.body[..], br#"{"label_id":"label-c-1"}"#);
    assert_eq!(db.rows("c-1").await, 1);
    assert!(db.recorded("c-1").await);
    assert_eq!(db.open_transactions(), 0);
    let retry = send(&service, "c-1", "ok").await;
    assert_eq!(retry.status, 201);
    assert!(retry.body.is_empty());
    assert_eq!(retry.headers["idempotent-body-omitted"], "true");
    assert_eq!(db.rows("c-1").await, 1);
}

/// By default a handler that wrote its row in the claim's transaction and then answered a
/// server error leaves nothing: the `500` is passed on unstored, the transaction rolled back,
/// the key free (a retry runs the create again, and another payload may take the key); a
/// client error commits with its row and is replayed. `StoredResponses::Every` keeps the
/// `500` too, committed with its row.
pub(crate) async fn a_server_error_rolls_back_by_default_and_every_keeps_it<D: TxDb>() {
    let db = D::make("server_error").await;
    let service = db.service();
    for _ in 0..2 {
        let failed = send(&service, "se-1", "server-error").await;
        assert_eq!(failed.status, 500);
        assert_eq!(failed.outcome, Some(Outcome::Unstored));
        assert_eq!(db.rows("se-1").await, 0, "rolled back");
    }
    assert_eq!(
        send(&service, "se-1", "ok").await.status,
        201,
        "the key is free"
    );
    assert_eq!(db.rows("se-1").await, 1);

    let refused = send(&service, "ce-1", "client-error").await;
    assert_eq!(refused.status, 422);
    assert_eq!(db.rows("ce-1").await, 1, "committed with its answer");
    let again = send(&service, "ce-1", "client-error").await;
    assert_eq!(
        (again.status, again.outcome),
        (StatusCode::UNPROCESSABLE_ENTITY, Some(Outcome::Replay))
    );
    assert_eq!(db.rows("ce-1").await, 1);
    assert_eq!(db.open_transactions(), 0);

    let every = IdempotencyLayer::new(db.store().clone(), LabelContract)
        .global_keys()
        .value_extension(true)
        .store_responses(StoredResponses::Every)
        .layer(db.create());
    assert_eq!(send(&every, "se-2", "server-error").await.status, 500);
    assert_eq!(db.rows("se-2").await, 1, "committed with its 500");
    let replayed = send(&every, "se-2", "server-error").await;
    assert_eq!(
        (replayed.status, replayed.outcome),
        (StatusCode::INTERNAL_SERVER_ERROR, Some(Outcome::Replay))
    );
}

/// The cases above as tests of the file's `Db` (a [`TxDb`]).
macro_rules! transactional_cases {
    () => {
        mod cases {
            use super::Db;
            use $crate::transactional_cases as case;

            #[tokio::test]
            async fn the_record_and_the_creates_row_commit_together_and_replay() {
                case::the_record_and_the_creates_row_commit_together_and_replay::<Db>().await;
            }

            #[tokio::test]
            async fn a_create_that_fails_or_panics_leaves_no_row_and_a_free_key() {
                case::a_create_that_fails_or_panics_leaves_no_row_and_a_free_key::<Db>().await;
            }

            #[tokio::test]
            async fn an_admission_refusal_rolls_the_claim_back() {
                case::an_admission_refusal_rolls_the_claim_back::<Db>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_second_attempt_while_the_first_is_open_is_pending_at_once() {
                case::a_second_attempt_while_the_first_is_open_is_pending_at_once::<Db>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_replays_and_conflicts_of_a_completed_key_are_never_pending() {
                case::concurrent_replays_and_conflicts_of_a_completed_key_are_never_pending::<Db>()
                    .await;
            }

            #[tokio::test]
            async fn a_response_over_the_cap_commits_with_its_compact_record() {
                case::a_response_over_the_cap_commits_with_its_compact_record::<Db>().await;
            }

            #[tokio::test]
            async fn a_server_error_rolls_back_by_default_and_every_keeps_it() {
                case::a_server_error_rolls_back_by_default_and_every_keeps_it::<Db>().await;
            }
        }
    };
}

pub(crate) use transactional_cases;
