//! The black-box checker (`check`, feature `check`) against endpoints over real HTTP: the
//! layer's own (every scenario passes) and small servers written here, each with one flaw that
//! the scenario meant for it reports, and no other scenario misreports: a check-then-act claim,
//! a replay that changes its body or loses `Location`, no fingerprint check, a key space
//! without the path.
//!
//! The race: the check-then-act server below looks the key up, then creates (20 ms, a
//! database insert and a call or two), then stores. Its flaw was found by
//! `concurrent_identical` in 150 runs of 150 on this 2-core machine with both cores kept busy
//! by two other processes, each run with 16 requests at once; the test runs it 5 times. With a
//! create of 2 ms it was found 50 times of 50 on an idle machine, but under the same load 4
//! tests of 10 missed it once: a burst's requests then arrive over more than the window.
#![cfg(feature = "check")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, header};
use tower_idempotency::check::{Http, Report, Slow, Target, Verdict, run};
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

/// Serves `router` on a free port of loopback: its URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}/payments")
}

async fn check(url: String) -> Report {
    let refunds = url.replace("/payments", "/refunds");
    let delay_hook = Slow::Header(
        http::HeaderName::from_static("x-delay-ms"),
        http::HeaderValue::from_static("400"),
        Duration::from_millis(100),
    );
    let target = Target::new(Method::POST, url)
        .body(r#"{"amount":{{n}},"currency":"EUR"}"#)
        .concurrency(16)
        .other_url(refunds)
        .slow(delay_hook);
    run(&target, &tower_idempotency::check::client().unwrap()).await
}

fn failing(report: &Report) -> Vec<&'static str> {
    report
        .scenarios
        .iter()
        .filter(|s| s.verdict == Verdict::Fail)
        .map(|s| s.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_passes_every_scenario() {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    async fn create(uri: http::Uri, headers: HeaderMap, body: Bytes) -> Response {
        if let Some(ms) = headers
            .get("x-delay-ms")
            .and_then(|v| v.to_str().ok()?.parse().ok())
        {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let id = NEXT.fetch_add(1, Ordering::SeqCst);
        let location = format!("{}/{id}", uri.path());
        (StatusCode::CREATED, [(header::LOCATION, location)], body).into_response()
    }
    let router = axum::Router::new()
        .route("/payments", axum::routing::post(create))
        .route("/refunds", axum::routing::post(create))
        .layer(IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).global_keys());
    let report = check(serve(router).await).await;
    assert!(report.passed(), "{report}");
    // Every scenario but the lifetime's, which has its own test (it waits).
    assert!(
        report
            .scenarios
            .iter()
            .all(|s| s.verdict == Verdict::Pass || s.name == "after_lifetime"),
        "{report}"
    );
    let names: Vec<_> = report.scenarios.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "create_then_replay",
            "conflict",
            "bad_keys",
            "concurrent_identical",
            "concurrent_conflicting",
            "reordered_json",
            "other_endpoint",
            "other_method",
            "retry_while_running",
            "advertised_lifetime",
            "after_lifetime",
        ]
    );
    // The bodies' numbers start past 1000, as documented.
    let numbers: Vec<u64> = report
        .scenarios
        .iter()
        .flat_map(|s| &s.evidence)
        .filter_map(|e| {
            let after = e.request.split(r#""amount":"#).nth(1)?;
            after
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        !numbers.is_empty() && numbers.iter().all(|n| *n > 1000),
        "{numbers:?}"
    );
    let conflict = report.scenario("conflict").unwrap();
    assert!(
        conflict.summary.contains("refused with 422, and"),
        "{}",
        conflict.summary
    );
    // The layer's 409s carry Retry-After.
    assert!(
        report
            .scenarios
            .iter()
            .all(|s| !s.summary.contains("without Retry-After")),
        "{report}"
    );
    let json = report.to_json();
    assert_eq!(json["passed"], true);
    assert_eq!(json["scenarios"].as_array().unwrap().len(), 11);
    let first = &json["scenarios"][0];
    assert_eq!(first["name"], "create_then_replay");
    assert_eq!(first["verdict"], "pass");
    assert_eq!(first["suffering"], "");
    let evidence = &first["evidence"][0];
    assert_eq!(evidence["status"], 201);
    assert!(
        evidence["request"]
            .as_str()
            .unwrap()
            .starts_with("POST http://127.0.0.1:")
    );
    assert!(
        evidence["headers"][0]
            .as_str()
            .unwrap()
            .starts_with("location: /payments/")
    );
    assert!(evidence["error"].is_null());
    assert_eq!(evidence["version"], "HTTP/1.1");
}

/// The same over HTTP/2 with prior knowledge (h2c), the version in the evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_passes_over_http2() {
    let router = axum::Router::new()
        .route(
            "/payments",
            axum::routing::post(|body: Bytes| async move {
                static NEXT: AtomicU64 = AtomicU64::new(1);
                let id = NEXT.fetch_add(1, Ordering::SeqCst);
                (
                    StatusCode::CREATED,
                    [(header::LOCATION, format!("/payments/{id}"))],
                    body,
                )
            }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).global_keys());
    let target = Target::new(Method::POST, serve(router).await)
        .body(r#"{"amount":{{n}},"currency":"EUR"}"#)
        .concurrency(16);
    let client = tower_idempotency::check::client_with(Http::Http2, &[]).unwrap();
    let report = run(&target, &client).await;
    assert!(report.passed(), "{report}");
    let evidence = &report.scenario("create_then_replay").unwrap().evidence[0];
    assert_eq!(evidence.version, "HTTP/2.0", "{evidence:?}");
}

/// One flaw of a hand-written idempotent create.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flaw {
    None,
    /// The key is looked up, the create runs, then the key is stored: not atomic.
    CheckThenAct,
    /// A replay writes the body anew (a served-at counter in it).
    ReplayChangesBody,
    /// A replay answers without `Location`.
    ReplayLosesLocation,
    /// The body is not compared: another body under the key replays the first.
    NoFingerprint,
    /// The key space has neither the path nor the method: a key on `/refunds`, or with `PUT`,
    /// replays the `POST` on `/payments`.
    SharedKeySpace,
    /// The body is compared byte for byte: the same JSON reordered is another body, refused.
    BytesCompared,
    /// The key space has the body's bytes in it: the same JSON reordered, or another body, is
    /// another operation, created anew.
    BytesKeyed,
}

struct Server {
    flaw: Flaw,
    /// By key: the payload, and the resource's id once created (`None` while its create runs).
    records: Mutex<HashMap<String, (serde_json::Value, Option<u64>)>>,
    next: AtomicU64,
}

async fn flawed(
    State(server): State<Arc<Server>>,
    method: Method,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let keys: Vec<_> = headers.get_all("idempotency-key").iter().collect();
    let key = match keys.as_slice() {
        [key] if !key.is_empty() && key.len() <= 255 => key.to_str().unwrap_or("").to_owned(),
        _ => return StatusCode::BAD_REQUEST.into_response(),
    };
    let key = match server.flaw {
        Flaw::SharedKeySpace => key,
        Flaw::BytesKeyed => format!("{method} {} {key} {body:?}", uri.path()),
        _ => format!("{method} {} {key}", uri.path()),
    };
    let Ok(mut payload) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if server.flaw == Flaw::BytesCompared {
        payload = serde_json::Value::String(String::from_utf8_lossy(&body).into_owned());
    }
    // A delay hook: the create takes this long.
    let delay = headers
        .get("x-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map_or(Duration::from_millis(20), Duration::from_millis);
    let found = server.records.lock().unwrap().get(&key).cloned();
    let id = match found {
        Some((stored, _)) if stored != payload && server.flaw != Flaw::NoFingerprint => {
            return StatusCode::UNPROCESSABLE_ENTITY.into_response();
        }
        Some((_, None)) => return StatusCode::CONFLICT.into_response(),
        Some((_, Some(id))) => {
            let served = server.next.fetch_add(1, Ordering::SeqCst);
            let body = match server.flaw {
                Flaw::ReplayChangesBody => format!(r#"{{"id":{id},"served":{served}}}"#),
                _ => format!(r#"{{"id":{id}}}"#),
            };
            if server.flaw == Flaw::ReplayLosesLocation {
                return (StatusCode::CREATED, body).into_response();
            }
            return (
                StatusCode::CREATED,
                [(header::LOCATION, format!("/payments/{id}"))],
                body,
            )
                .into_response();
        }
        None if server.flaw == Flaw::CheckThenAct => {
            // The create (a database insert), then the key stored, as if nobody else came.
            tokio::time::sleep(delay).await;
            let id = server.next.fetch_add(1, Ordering::SeqCst);
            server
                .records
                .lock()
                .unwrap()
                .insert(key, (payload, Some(id)));
            id
        }
        None => {
            {
                let mut records = server.records.lock().unwrap();
                if records.contains_key(&key) {
                    // Another request claimed it meanwhile.
                    return StatusCode::CONFLICT.into_response();
                }
                records.insert(key.clone(), (payload.clone(), None));
            }
            tokio::time::sleep(delay).await;
            let id = server.next.fetch_add(1, Ordering::SeqCst);
            server
                .records
                .lock()
                .unwrap()
                .insert(key, (payload, Some(id)));
            id
        }
    };
    let body = format!(r#"{{"id":{id}}}"#);
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/payments/{id}"))],
        body,
    )
        .into_response()
}

async fn flawed_report(flaw: Flaw) -> Report {
    let server = Arc::new(Server {
        flaw,
        records: Mutex::default(),
        next: AtomicU64::new(1),
    });
    let router = axum::Router::new()
        .route("/payments", axum::routing::post(flawed).put(flawed))
        .route("/refunds", axum::routing::post(flawed))
        .with_state(server);
    check(serve(router).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_flaw_is_reported_by_its_scenario_alone() {
    let correct = flawed_report(Flaw::None).await;
    assert!(failing(&correct).is_empty(), "{correct}");
    for (flaw, expected) in [
        (Flaw::ReplayChangesBody, vec!["create_then_replay"]),
        (Flaw::ReplayLosesLocation, vec!["create_then_replay"]),
        (Flaw::NoFingerprint, vec!["conflict"]),
        // A key space of the key alone: neither the path nor the method in it.
        (Flaw::SharedKeySpace, vec!["other_endpoint", "other_method"]),
    ] {
        let report = flawed_report(flaw).await;
        let mut failed = failing(&report);
        // The same flaw at once: a request with another body that arrives after the first
        // completed is told it succeeded too (whether one does is up to the scheduler), and
        // the scenario says so in the same words.
        if flaw == Flaw::NoFingerprint {
            failed.retain(|name| *name != "concurrent_conflicting");
            if let Some(at_once) = report.scenario("concurrent_conflicting")
                && at_once.verdict == Verdict::Fail
            {
                assert!(at_once.suffering.contains("it never ran"), "{report}");
            }
        }
        assert_eq!(failed, expected, "{flaw:?}: {report}");
    }
    // A replay that keeps Location but changes its body: the client reads another answer.
    let changed = flawed_report(Flaw::ReplayChangesBody).await;
    let replay = changed.scenario("create_then_replay").unwrap();
    assert!(
        replay.suffering.contains("reads another answer"),
        "{}",
        replay.suffering
    );
    let lost = flawed_report(Flaw::ReplayLosesLocation).await;
    let replay = lost.scenario("create_then_replay").unwrap();
    assert!(
        replay.summary.contains("another location"),
        "{}",
        replay.summary
    );
    assert!(
        replay.suffering.contains("where its resource is"),
        "{}",
        replay.suffering
    );
    let reused = flawed_report(Flaw::NoFingerprint).await;
    let conflict = reused.scenario("conflict").unwrap();
    assert!(
        conflict.suffering.contains("it never ran"),
        "{}",
        conflict.suffering
    );
    assert_eq!(conflict.evidence.len(), 3);
}

/// The same JSON reordered: refused by a server that compares bytes (a note, not a failure),
/// created anew by one whose key space holds the bytes (a failure, with `conflict`'s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reordered_body_refused_is_noted_and_created_anew_fails() {
    let bytes = flawed_report(Flaw::BytesCompared).await;
    assert!(failing(&bytes).is_empty(), "{bytes}");
    let reordered = bytes.scenario("reordered_json").unwrap();
    assert_eq!(reordered.verdict, Verdict::NotApplicable, "{bytes}");
    assert!(
        reordered.summary.contains("the server compares bytes"),
        "{}",
        reordered.summary
    );
    let keyed = flawed_report(Flaw::BytesKeyed).await;
    let mut failed = failing(&keyed);
    // Bodies different at once are each another operation: one or more succeed.
    failed.retain(|name| *name != "concurrent_conflicting");
    assert_eq!(failed, ["conflict", "reordered_json"], "{keyed}");
    let reordered = keyed.scenario("reordered_json").unwrap();
    assert!(
        reordered.summary.contains("created anew"),
        "{}",
        reordered.summary
    );
}

/// An endpoint that answers a body of up to 1 MiB is read whole; past it, the answer is an
/// error, whatever its chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_read_up_to_a_mebibyte() {
    const MIB: usize = 1024 * 1024;
    for (size, readable) in [(MIB, true), (MIB + 1, false)] {
        let router = axum::Router::new().route(
            "/payments",
            // A body this size reaches the client in several reads of the socket.
            axum::routing::post(move || async move { (StatusCode::CREATED, vec![b'x'; size]) }),
        );
        let target = Target::new(Method::POST, serve(router).await).only(["create_then_replay"]);
        let report = run(&target, &tower_idempotency::check::client().unwrap()).await;
        let first = &report.scenario("create_then_replay").unwrap().evidence[0];
        assert_eq!(first.error.is_none(), readable, "{size}: {first:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_then_act_claim_is_found_by_the_concurrent_scenarios_and_a_slow_retry() {
    for _ in 0..5 {
        let report = flawed_report(Flaw::CheckThenAct).await;
        let failed = failing(&report);
        assert!(failed.contains(&"concurrent_identical"), "{report}");
        assert!(
            failed
                .iter()
                .all(|name| name.starts_with("concurrent_") || *name == "retry_while_running"),
            "{report}"
        );
        let race = report.scenario("concurrent_identical").unwrap();
        assert!(
            race.suffering
                .contains("two resources created for one intent")
        );
        // A retry during a slow create races it as surely.
        let slow = report.scenario("retry_while_running").unwrap();
        assert_eq!(slow.verdict, Verdict::Fail, "{report}");
        assert!(
            slow.suffering.contains("creates twice"),
            "{}",
            slow.suffering
        );
    }
}

/// An endpoint that creates nothing (down, or a template it refuses) fails every scenario as
/// a misconfiguration, never passes one; a key sent quoted is the draft's form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_creates_nothing_passes_nothing() {
    async fn refuse() -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }
    let router = axum::Router::new().route("/payments", axum::routing::post(refuse));
    let report = check(serve(router).await).await;
    assert!(!report.passed());
    for scenario in &report.scenarios {
        assert_ne!(scenario.verdict, Verdict::Pass, "{report}");
    }
    let race = report.scenario("concurrent_identical").unwrap();
    assert!(race.summary.contains("created nothing"), "{}", race.summary);

    let router = axum::Router::new()
        .route(
            "/payments",
            axum::routing::post(|body: Bytes| async move {
                (
                    StatusCode::CREATED,
                    [(header::LOCATION, "/payments/1")],
                    body,
                )
            }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).global_keys());
    let url = serve(router).await;
    let target = Target::new(Method::POST, url)
        .body(r#"{"amount":{{n}}}"#)
        .quote_key()
        .only(["create_then_replay"]);
    let report = run(&target, &tower_idempotency::check::client().unwrap()).await;
    assert!(report.passed(), "{report}");
    let request = &report.scenarios[0].evidence[0].request;
    assert!(request.contains(r#"key="check-"#), "{request}");
}

/// An endpoint with no idempotency at all whose creates all answer `201 {}`: a replay cannot
/// be told from a second create, so the scenarios that would need to say so do not pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_that_answer_alike_are_not_judged_as_replays() {
    let router = axum::Router::new().route(
        "/payments",
        axum::routing::post(|| async { (StatusCode::CREATED, "{}") }),
    );
    let report = check(serve(router).await).await;
    for name in [
        "create_then_replay",
        "concurrent_identical",
        "reordered_json",
    ] {
        let scenario = report.scenario(name).unwrap();
        assert_eq!(scenario.verdict, Verdict::NotApplicable, "{report}");
        assert!(
            scenario
                .summary
                .contains("cannot be told from a second create")
        );
    }
    assert!(!report.passed(), "{report}");
}

/// Over TLS with a CA of the test's own (made with the `openssl` command): trusted through
/// `client_with`'s roots, the checker passes every scenario and negotiates HTTP/2 (ALPN);
/// without the CA, nothing is answered and nothing passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_with_a_ca_of_its_own() {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let dir = std::env::temp_dir().join(format!("check-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("the openssl command");
        assert!(status.success(), "openssl {args:?}");
    };
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=check test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    let ca = std::fs::read(dir.join("ca.pem")).unwrap();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    // The process's provider, as the checker installs it.
    let without_ca = tower_idempotency::check::client().unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    static NEXT: AtomicU64 = AtomicU64::new(1);
    let router = axum::Router::new()
        .route(
            "/payments",
            axum::routing::post(|body: Bytes| async move {
                let id = NEXT.fetch_add(1, Ordering::SeqCst);
                (
                    StatusCode::CREATED,
                    [(header::LOCATION, format!("/payments/{id}"))],
                    body,
                )
            }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).global_keys());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(router);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    });
    let target = Target::new(Method::POST, format!("https://{addr}/payments"))
        .body(r#"{"amount":{{n}},"currency":"EUR"}"#)
        .concurrency(16);

    let roots = reqwest::Certificate::from_pem_bundle(&ca).unwrap();
    let trusting = tower_idempotency::check::client_with(Http::Negotiated, &roots).unwrap();
    let report = run(&target, &trusting).await;
    assert!(report.passed(), "{report}");
    let evidence = &report.scenario("create_then_replay").unwrap().evidence[0];
    assert_eq!(evidence.version, "HTTP/2.0", "{evidence:?}");

    let report = run(&target.only(["create_then_replay"]), &without_ca).await;
    assert!(!report.passed(), "{report}");
    let evidence = &report.scenarios[0].evidence[0];
    assert!(
        evidence.status.is_none() && evidence.error.is_some(),
        "{evidence:?}"
    );
}

/// `after_lifetime`: a key kept for a second is refused as expired 1.5 s later while its
/// tombstone is kept (the default), and forgotten (created anew) without tombstones; one kept
/// longer still replays; each is what a client may rely on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_after_its_lifetime_is_refused_created_anew_or_replayed() {
    let second = Duration::from_secs(1);
    for (store, expected) in [
        (
            MemoryStore::builder().retention(second).build(),
            "refused as expired",
        ),
        (
            MemoryStore::builder()
                .retention(second)
                .tombstones(Duration::ZERO)
                .build(),
            "forgotten",
        ),
        (
            MemoryStore::builder()
                .retention(Duration::from_secs(3600))
                .build(),
            "still replays",
        ),
    ] {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let router = axum::Router::new()
            .route(
                "/payments",
                axum::routing::post(|body: Bytes| async move {
                    let id = NEXT.fetch_add(1, Ordering::SeqCst);
                    (
                        StatusCode::CREATED,
                        [(header::LOCATION, format!("/payments/{id}"))],
                        body,
                    )
                }),
            )
            .layer(IdempotencyLayer::new(store, JsonOperation::new()).global_keys());
        let target = Target::new(Method::POST, serve(router).await)
            .body(r#"{"amount":{{n}}}"#)
            .after(Duration::from_millis(1500))
            .only(["after_lifetime"]);
        let report = run(&target, &tower_idempotency::check::client().unwrap()).await;
        let scenario = &report.scenarios[0];
        assert_eq!(scenario.verdict, Verdict::Pass, "{report}");
        assert!(scenario.summary.contains(expected), "{report}");
    }
}

/// A late retry's refusal of the key as expired.
const KEY_EXPIRED: &str = r#"{"type":"https://example.com/problems/key_expired"}"#;

/// A late retry's refusal of its caller, whose token expired.
const TOKEN_EXPIRED: &str = r#"{"error":"invalid_token","error_description":"The token expired"}"#;

/// `after_lifetime` (100 ms) against a server that creates a key's first request and answers
/// every later one with `status` and `body`.
async fn after_lifetime_against(status: StatusCode, body: &'static str) -> Report {
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let router = axum::Router::new().route(
        "/payments",
        axum::routing::post(move |headers: http::HeaderMap, sent: Bytes| async move {
            let key = headers["idempotency-key"].to_str().unwrap().to_owned();
            if !seen.lock().unwrap().insert(key.clone()) {
                return (status, body).into_response();
            }
            let location = [(header::LOCATION, format!("/payments/{key}"))];
            (StatusCode::CREATED, location, sent).into_response()
        }),
    );
    let target = Target::new(Method::POST, serve(router).await)
        .body(r#"{"amount":{{n}}}"#)
        .after(Duration::from_millis(100))
        .only(["after_lifetime"]);
    run(&target, &tower_idempotency::check::client().unwrap()).await
}

/// `after_lifetime`: a server that refuses a key past its lifetime as expired passes (the create
/// is not made twice), as does one that creates anew, with a note; `advertised_lifetime` reads
/// the lifetime the layer advertises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_refused_as_expired_after_its_lifetime_passes_and_the_lifetime_is_read() {
    let report = after_lifetime_against(StatusCode::CONFLICT, KEY_EXPIRED).await;
    let scenario = &report.scenarios[0];
    assert_eq!(scenario.verdict, Verdict::Pass, "{report}");
    assert!(scenario.summary.contains("refused as expired"), "{report}");
    // A late retry refused because the caller's token expired (401) says nothing of the key:
    // not a pass.
    let report = after_lifetime_against(StatusCode::UNAUTHORIZED, TOKEN_EXPIRED).await;
    assert_eq!(report.scenarios[0].verdict, Verdict::Fail, "{report}");

    let store = MemoryStore::builder()
        .retention(Duration::from_secs(90))
        .build();
    let router = axum::Router::new()
        .route(
            "/payments",
            axum::routing::post(|body: Bytes| async move { (StatusCode::CREATED, body) }),
        )
        .layer(IdempotencyLayer::new(store, JsonOperation::new()).global_keys());
    let target = Target::new(Method::POST, serve(router).await)
        .body(r#"{"amount":{{n}}}"#)
        .only(["advertised_lifetime"]);
    let report = run(&target, &tower_idempotency::check::client().unwrap()).await;
    let scenario = &report.scenarios[0];
    assert_eq!(scenario.verdict, Verdict::Pass, "{report}");
    assert!(scenario.summary.contains("90 s"), "{report}");
}
