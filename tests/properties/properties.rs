//! Property tests: random requests against an oracle of the contract's validation, and random
//! operation sequences (interleavings included) against a model of its state machine.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::*;
use proptest::prelude::*;

// Validation -------------------------------------------------------------------------------

const ALPHABET: &str = "[A-Za-z0-9_-]{1,12}";

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("POST".to_owned()),
        1 => prop::sample::select(vec!["GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]).prop_map(str::to_owned),
        1 => "[A-Z]{1,7}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just("/labels".to_owned()),
        1 => prop::sample::select(vec!["/labels/", "/Labels", "/", "/labels/x", "/other"]).prop_map(str::to_owned),
        1 => "/[a-z]{0,8}",
    ]
}

/// A content type and whether the contract accepts it.
fn content_type() -> impl Strategy<Value = Option<(String, bool)>> {
    let json = prop::sample::select(vec![
        "application/json",
        "APPLICATION/JSON",
        "Application/Json",
    ]);
    let parameters =
        prop::sample::select(vec!["", "; charset=utf-8", ";charset=\"utf-8\"", " ; q=1"]);
    let accepted = (json, parameters).prop_map(|(t, p)| (format!("{t}{p}"), true));
    let other_type = prop::sample::select(vec![
        "text/plain",
        "application/xml",
        "application/jsonx",
        "json",
    ]);
    let refused = prop_oneof![
        (
            other_type,
            prop::sample::select(vec!["", "; charset=utf-8"])
        )
            .prop_map(|(t, p)| format!("{t}{p}")),
        "[a-z]{1,8}/[a-z]{1,8}".prop_filter("not json", |t| t != "application/json"),
        Just("application/json; charset".to_owned()),
    ]
    .prop_map(|t| (t, false));
    prop::option::weighted(0.9, prop_oneof![4 => accepted, 1 => refused])
}

/// A body: valid operations, near misses, and noise.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let valid = (ALPHABET, ALPHABET)
        .prop_map(|(r, p)| format!(r#"{{"request_id":"{r}","parcel_id":"{p}"}}"#));
    let reordered = (ALPHABET, ALPHABET)
        .prop_map(|(r, p)| format!(r#" {{ "parcel_id" : "{p}", "request_id":"{r}" }} "#));
    let any_strings = (".{0,8}", ".{0,8}")
        .prop_map(|(r, p)| serde_json::json!({"request_id": r, "parcel_id": p}).to_string());
    let extra = (ALPHABET, ALPHABET)
        .prop_map(|(r, p)| format!(r#"{{"request_id":"{r}","parcel_id":"{p}","x":1}}"#));
    let wrong_types = (
        ALPHABET,
        prop::sample::select(vec!["null", "1", "true", "[]", "{}", "\"\""]),
    )
        .prop_map(|(r, v)| format!(r#"{{"request_id":"{r}","parcel_id":{v}}}"#));
    let trailing = (
        ALPHABET,
        ALPHABET,
        prop::sample::select(vec!["{}", "x", "1", "\"a\""]),
    )
        .prop_map(|(r, p, t)| format!(r#"{{"request_id":"{r}","parcel_id":"{p}"}} {t}"#));
    // Valid operations padded with whitespace to just under, at and just over the limit.
    let padded = (ALPHABET, ALPHABET, 4094usize..=4098).prop_map(|(r, p, total)| {
        let mut body = format!(r#"{{"request_id":"{r}","parcel_id":"{p}"}}"#);
        body.extend(std::iter::repeat_n(' ', total - body.len()));
        body
    });
    prop_oneof![
        4 => valid.prop_map(String::into_bytes),
        1 => reordered.prop_map(String::into_bytes),
        1 => any_strings.prop_map(String::into_bytes),
        1 => extra.prop_map(String::into_bytes),
        1 => wrong_types.prop_map(String::into_bytes),
        1 => trailing.prop_map(String::into_bytes),
        1 => padded.prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..5000),
    ]
}

/// The `request_id` of a valid body, by an oracle independent of the crate's parser.
fn oracle_request_id(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    if object.len() != 2 {
        return None;
    }
    let field = |name: &str| -> Option<String> {
        let text = object.get(name)?.as_str()?;
        let ok = !text.is_empty()
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        ok.then(|| text.to_owned())
    };
    field("parcel_id")?;
    field("request_id")
}

#[derive(Debug, Clone)]
struct Attempt {
    method: String,
    path: String,
    content_type: Option<(String, bool)>,
    body: Vec<u8>,
    key: Option<String>,
    chunked: bool,
}

fn attempt() -> impl Strategy<Value = Attempt> {
    (
        method(),
        path(),
        content_type(),
        body(),
        prop::option::weighted(
            0.9,
            prop_oneof![3 => Just(None), 1 => ALPHABET.prop_map(Some)],
        ),
        any::<bool>(),
    )
        .prop_map(|(method, path, content_type, body, key, chunked)| {
            // Mostly the right key: the body's own request_id.
            let key = match key {
                Some(None) => oracle_request_id(&body).or(Some("k".to_owned())),
                Some(Some(other)) => Some(other),
                None => None,
            };
            Attempt {
                method,
                path,
                content_type,
                body,
                key,
                chunked,
            }
        })
}

/// The contract's answer: the first failing step decides.
fn expected(a: &Attempt) -> (u16, &'static str) {
    if a.path != "/labels" {
        return (404, r#"{"error":"not_found"}"#);
    }
    if a.method != "POST" {
        return (405, r#"{"error":"method_not_allowed"}"#);
    }
    if !matches!(a.content_type, Some((_, true))) {
        return (415, r#"{"error":"unsupported_media_type"}"#);
    }
    if a.body.len() > 4096 {
        return (413, r#"{"error":"payload_too_large"}"#);
    }
    match oracle_request_id(&a.body) {
        Some(id) if a.key.as_deref() == Some(id.as_str()) => (201, CREATED_BODY),
        _ => (400, r#"{"error":"invalid_request"}"#),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, ..ProptestConfig::default() })]

    #[test]
    fn every_reply_is_the_contracts_and_refusals_touch_nothing(a in attempt()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let rig = Rig::new();
            let mut builder = http::Request::builder().method(a.method.as_str()).uri(a.path.as_str());
            if let Some((content_type, _)) = &a.content_type {
                builder = builder.header("content-type", content_type.as_str());
            }
            if let Some(key) = &a.key {
                builder = builder.header("idempotency-key", key.as_str());
            }
            let body = if a.chunked {
                Chunks::many(a.body.chunks(7).map(<[u8]>::to_vec))
            } else {
                Chunks::one(Bytes::from(a.body.clone()))
            };
            let reply = rig.send(builder.body(body).unwrap()).await;
            let (status, body) = expected(&a);
            prop_assert_eq!(reply.status.as_u16(), status, "{:?}", a);
            prop_assert_eq!(&reply.body[..], body.as_bytes());
            prop_assert_eq!(reply.values("content-type"), ["application/json"]);
            let journal = rig.journal.take();
            if status == 201 {
                prop_assert_eq!(journal, ["claim", "admit", "create", "complete", "write"]);
            } else {
                prop_assert_eq!(journal, ["write"], "refusals never reach the store");
                prop_assert!(rig.memory.is_empty());
            }
            Ok(())
        })?;
    }
}

// The state machine ------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    /// A request for key `k`, parcel `p`, with admission answering `admit` and the create
    /// failing if `fails`.
    Send {
        k: usize,
        p: usize,
        admit: u16,
        fails: bool,
    },
    /// A request whose create waits until `Finish` (at most one is held at a time).
    Hold { k: usize, p: usize },
    /// Lets the held create finish and checks its reply.
    Finish,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, 0..2usize, prop::sample::select(vec![0u16, 0, 0, 429, 503]), prop::bool::weighted(0.1))
            .prop_map(|(k, p, admit, fails)| Op::Send { k, p, admit, fails }),
        1 => (0..3usize, 0..2usize).prop_map(|(k, p)| Op::Hold { k, p }),
        1 => Just(Op::Finish),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum Record {
    Pending(usize),
    Done(usize, String),
}

/// What the contract says a request does to the model, and its reply.
fn model_send(
    model: &mut HashMap<usize, Record>,
    k: usize,
    p: usize,
    admit: u16,
    create: impl FnOnce() -> Option<String>,
) -> (u16, String) {
    match model.get(&k) {
        Some(Record::Pending(q) | Record::Done(q, _)) if *q != p => {
            (409, r#"{"error":"idempotency_conflict"}"#.into())
        }
        Some(Record::Pending(_)) => (409, r#"{"error":"request_pending"}"#.into()),
        Some(Record::Done(_, body)) => (201, body.clone()),
        None if admit != 0 => (admit, r#"{"error":"not_admitted"}"#.into()),
        None => match create() {
            Some(body) => {
                model.insert(k, Record::Done(p, body.clone()));
                (201, body)
            }
            None => {
                model.insert(k, Record::Pending(p));
                (500, r#"{"error":"create_failed"}"#.into())
            }
        },
    }
}

fn key_request(k: usize, p: usize, flag: Option<&'static str>) -> http::Request<Chunks> {
    let mut request = operation(&format!("key-{k}"), &format!("parcel-{p}"));
    if let Some(flag) = flag {
        request.headers_mut().insert(flag, "1".parse().unwrap());
    }
    request
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_layer_follows_the_contracts_state_machine(ops in prop::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let creates = Arc::new(AtomicUsize::new(0));
            let gate = Arc::new(tokio::sync::Notify::new());
            let rig = {
                let (creates, gate) = (Arc::clone(&creates), Arc::clone(&gate));
                Rig::around(move |journal| {
                    tower::service_fn(move |request: http::Request<tower_idempotency::layer::RequestBody<Chunks>>| {
                        journal.record("create");
                        let n = creates.fetch_add(1, Ordering::SeqCst) + 1;
                        let (fails, held) = (request.headers().contains_key("x-fail"), request.headers().contains_key("x-hold"));
                        let gate = Arc::clone(&gate);
                        async move {
                            if held {
                                gate.notified().await;
                            }
                            if fails {
                                return Err(CreateError("create failed"));
                            }
                            let mut response = created_response();
                            *response.body_mut() = http_body_util::Full::new(Bytes::from(format!(r#"{{"label":{n}}}"#)));
                            Ok(response)
                        }
                    })
                })
            };
            let mut model: HashMap<usize, Record> = HashMap::new();
            // The held request: its task, its key and parcel, and the body its create makes.
            let mut held: Option<(tokio::task::JoinHandle<Reply>, usize, usize, String)> = None;
            let mut model_creates = 0;
            for op in ops {
                match op {
                    Op::Send { k, p, admit, fails } => {
                        rig.admission.refuse((admit != 0).then(|| refusal(admit)));
                        let mut would_create = false;
                        let (status, body) = model_send(&mut model, k, p, admit, || {
                            would_create = true;
                            (!fails).then(|| format!(r#"{{"label":{}}}"#, model_creates + 1))
                        });
                        model_creates += usize::from(would_create);
                        let reply = rig.send(key_request(k, p, fails.then_some("x-fail"))).await;
                        prop_assert_eq!(reply.status.as_u16(), status, "{:?}", op);
                        prop_assert_eq!(String::from_utf8_lossy(&reply.body), body);
                    }
                    Op::Hold { k, p } if held.is_none() => {
                        rig.admission.refuse(None);
                        let mut would_create = false;
                        let expected = model_send(&mut model, k, p, 0, || {
                            would_create = true;
                            None // pending until Finish
                        });
                        let service = rig.service.clone();
                        let request = key_request(k, p, Some("x-hold"));
                        let task = tokio::spawn(async move {
                            Reply::read(tower::ServiceExt::oneshot(service, request).await.unwrap()).await
                        });
                        if would_create {
                            model_creates += 1;
                            let body = format!(r#"{{"label":{model_creates}}}"#);
                            // Wait until the create is under way, so the model's pending is real.
                            let target = model_creates;
                            wait_for(|| creates.load(Ordering::SeqCst) == target).await;
                            model.insert(k, Record::Pending(p));
                            held = Some((task, k, p, body));
                        } else {
                            let reply = task.await.unwrap();
                            prop_assert_eq!(reply.status.as_u16(), expected.0, "{:?}", op);
                            prop_assert_eq!(String::from_utf8_lossy(&reply.body), expected.1);
                        }
                    }
                    Op::Hold { .. } => {}
                    Op::Finish => {
                        if let Some((task, k, p, body)) = held.take() {
                            gate.notify_one();
                            let reply = task.await.unwrap();
                            prop_assert_eq!(reply.status.as_u16(), 201);
                            prop_assert_eq!(String::from_utf8_lossy(&reply.body).into_owned(), body.clone());
                            model.insert(k, Record::Done(p, body));
                        }
                    }
                }
                prop_assert_eq!(creates.load(Ordering::SeqCst), model_creates, "one create per new operation");
            }
            if let Some((task, ..)) = held.take() {
                gate.notify_one();
                task.await.unwrap();
            }
            Ok(())
        })?;
    }
}
