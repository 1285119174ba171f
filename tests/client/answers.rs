//! What the client reads of an answer to decide on it: gRPC statuses in headers or trailers, the limits of what is read, a body's last frame, an answer too long to decide on.
#![cfg(feature = "client")]

#[allow(unused_imports)]
use crate::client::*;
#[allow(unused_imports)]
use crate::end_to_end::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{BoxError, Layer, ServiceExt, service_fn};
use tower_idempotency::client::{Attempts, ClientLayer};

/// A gRPC answer: `grpc-status` `code` in the headers (trailers only) or after a message in
/// the trailers, or no status at all (`None`: the answer was cut short).
pub(crate) fn grpc_answer(code: Option<&str>, trailers_only: bool, web: bool) -> Response<Frames> {
    let mut frames = std::collections::VecDeque::new();
    let mut response = Response::builder().header(
        "content-type",
        if web {
            "application/grpc-web+proto"
        } else {
            "application/grpc"
        },
    );
    match (code, trailers_only) {
        (Some(code), true) => response = response.header("grpc-status", code),
        (code, _) => {
            frames.push_back(http_body::Frame::data(Bytes::from_static(
                b"\0\0\0\0\x02hi",
            )));
            if let Some(code) = code {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", code.parse().unwrap());
                frames.push_back(http_body::Frame::trailers(trailers));
            }
        }
    }
    response.body(Frames(frames)).unwrap()
}

/// gRPC answers are decided by their `grpc-status`, in the headers or the trailers:
/// `UNAVAILABLE` and `ABORTED` retried, every other code final, an answer without a status a
/// lost one (retried); the answer read for its trailers is given whole, message and trailers.
/// gRPC-web answers are decided by their HTTP status.
#[tokio::test(start_paused = true)]
pub(crate) async fn grpc_answers_are_decided_by_their_status_in_headers_or_trailers() {
    type Script = Vec<(Option<&'static str>, bool, bool)>;
    let run = |script: Script| async move {
        let next = Arc::new(AtomicUsize::new(0));
        let served = Arc::clone(&next);
        let server = service_fn(move |_: Request<Full<Bytes>>| {
            let i = served.fetch_add(1, Ordering::SeqCst).min(script.len() - 1);
            let (code, trailers_only, web) = script[i];
            async move { Ok::<_, BoxError>(grpc_answer(code, trailers_only, web)) }
        });
        let client = ClientLayer::new()
            .backoff(Duration::from_millis(1), Duration::from_millis(1))
            .layer(server);
        let mut call = intent(1);
        call.headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        let response = client.oneshot(call).await.unwrap();
        let attempts = response.extensions().get::<Attempts>().unwrap().0;
        let read = response.into_body().collect().await.unwrap();
        let status = read
            .trailers()
            .and_then(|trailers| trailers.get("grpc-status"))
            .map(|code| code.to_str().unwrap().to_owned());
        (attempts, read.to_bytes(), status)
    };
    // Retried in the trailers and in the headers, then OK in the trailers: given whole.
    let (attempts, message, status) = run(vec![
        (Some("14"), false, false),
        (Some("10"), true, false),
        (None, false, false),
        (Some("0"), false, false),
    ])
    .await;
    assert_eq!(attempts, 4);
    assert_eq!(message.as_ref(), b"\0\0\0\0\x02hi");
    assert_eq!(status.as_deref(), Some("0"));
    // Final at once: INVALID_ARGUMENT, FAILED_PRECONDITION, OK in the headers.
    for code in ["3", "9", "0"] {
        for trailers_only in [false, true] {
            let (attempts, _, _) = run(vec![(Some(code), trailers_only, false)]).await;
            assert_eq!(attempts, 1, "{code} {trailers_only}");
        }
    }
    // gRPC-web: its status is in its body; the HTTP status (200) decides.
    let (attempts, _, _) = run(vec![(Some("14"), false, true)]).await;
    assert_eq!(attempts, 1);
}

/// An answer too long for the layer to decide on (a gRPC answer over 4 MiB, a `409` over
/// 64 KiB, neither saying its length) is final, after one attempt, and given whole: what the
/// layer read, then the rest, then the trailers.
#[tokio::test(start_paused = true)]
pub(crate) async fn an_answer_too_long_to_decide_on_is_final_and_given_whole() {
    let chunk = Bytes::from(vec![b'x'; 1024 * 1024]);
    for (content_type, status, chunks) in [
        ("application/grpc", 200, 5),
        ("application/problem+json", 409, 1),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let sent = chunk.clone();
        let server = service_fn(move |_: Request<Full<Bytes>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            let mut frames: std::collections::VecDeque<_> = (0..chunks)
                .map(|_| http_body::Frame::data(sent.clone()))
                .collect();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            frames.push_back(http_body::Frame::trailers(trailers));
            let response = Response::builder()
                .status(status)
                .header("content-type", content_type)
                .body(Frames(frames))
                .unwrap();
            async move { Ok::<_, BoxError>(response) }
        });
        let response = ClientLayer::new()
            .layer(server)
            .oneshot(intent(1))
            .await
            .unwrap();
        assert_eq!(response.status(), status);
        assert_eq!(response.extensions().get::<Attempts>(), Some(&Attempts(1)));
        let read = response.into_body().collect().await.unwrap();
        let trailers = read.trailers().cloned();
        assert_eq!(
            read.to_bytes().len(),
            chunks * chunk.len(),
            "{content_type}"
        );
        assert_eq!(
            trailers.and_then(|t| t.get("grpc-status").cloned()),
            Some("0".parse().unwrap())
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "{content_type}: not retried"
        );
    }
}

/// A body of `len` bytes in chunks of at most 1 MiB, then `trailers` if any: no declared
/// length.
pub(crate) fn long_body(len: usize, trailers: Option<http::HeaderMap>) -> Frames {
    let mut frames = std::collections::VecDeque::new();
    let mut left = len;
    while left > 0 {
        let chunk = left.min(1024 * 1024);
        frames.push_back(http_body::Frame::data(Bytes::from(vec![b' '; chunk])));
        left -= chunk;
    }
    if let Some(trailers) = trailers {
        frames.push_back(http_body::Frame::trailers(trailers));
    }
    Frames(frames)
}

/// The limits are inclusive: a gRPC answer of exactly 4 MiB and its frame header, or a `409`
/// of exactly 64 KiB, is read whole and decided on (here: retried, as `UNAVAILABLE` and a
/// pending first attempt say); one byte more is final, however it would have been decided.
#[tokio::test(start_paused = true)]
pub(crate) async fn the_limits_of_what_is_read_to_decide_are_inclusive() {
    let pending = br#"{"error":"request_pending"}"#;
    for (grpc, limit) in [(true, 4 * 1024 * 1024 + 5), (false, 64 * 1024)] {
        for (len, retried) in [(limit, true), (limit + 1, false)] {
            let calls = Arc::new(AtomicUsize::new(0));
            let counted = Arc::clone(&calls);
            let server = service_fn(move |_: Request<Full<Bytes>>| {
                let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                let response = if !first {
                    Response::builder().status(201).body(long_body(0, None))
                } else if grpc {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", "14".parse().unwrap());
                    Response::builder()
                        .header("content-type", "application/grpc")
                        .body(long_body(len, Some(trailers)))
                } else {
                    // A pending answer padded with spaces after its JSON, to `len` bytes.
                    let mut body = long_body(len - pending.len(), None);
                    body.0
                        .push_front(http_body::Frame::data(Bytes::from_static(pending)));
                    Response::builder().status(409).body(body)
                };
                async move { Ok::<_, BoxError>(response.unwrap()) }
            });
            let response = ClientLayer::new()
                .backoff(Duration::from_millis(1), Duration::from_millis(1))
                .layer(server)
                .oneshot(intent(1))
                .await
                .unwrap();
            let attempts = response.extensions().get::<Attempts>().unwrap().0;
            assert_eq!(
                attempts,
                if retried { 2 } else { 1 },
                "grpc {grpc}, {len} bytes"
            );
            if !retried {
                // What the layer read first, then the rest: not over until the rest is.
                use http_body::Body as _;
                let mut body = std::pin::pin!(response.into_body());
                let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
                assert!(!body.is_end_stream(), "the rest to come");
                let rest = body.collect().await.unwrap().to_bytes();
                assert_eq!(first.len() + rest.len(), len, "given whole");
            }
        }
    }
}

/// A body the layer read whole ends when its data and trailers are out, not before; the
/// server's body, streamed, ends when the server's does.
#[tokio::test(start_paused = true)]
pub(crate) async fn a_read_body_ends_with_its_last_frame() {
    use http_body::Body as _;
    let server = service_fn(|_: Request<Full<Bytes>>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "3".parse().unwrap());
        let response = Response::builder()
            .header("content-type", "application/grpc")
            .body(long_body(10, Some(trailers)))
            .unwrap();
        Ok::<_, BoxError>(response)
    });
    let response = ClientLayer::new()
        .layer(server)
        .oneshot(intent(1))
        .await
        .unwrap();
    let mut body = std::pin::pin!(response.into_body());
    assert!(!body.is_end_stream(), "data and trailers to come");
    assert_eq!(body.size_hint().exact(), Some(10));
    let data = body.frame().await.unwrap().unwrap();
    assert_eq!(data.data_ref().map(Bytes::len), Some(10));
    assert!(!body.is_end_stream(), "the trailers to come");
    let trailers = body.frame().await.unwrap().unwrap();
    assert!(trailers.is_trailers());
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());
    // Streamed: the server's own.
    let (server, _) = scripted(vec![(201, vec![], "")]);
    let response = ClientLayer::new()
        .layer(server)
        .oneshot(intent(1))
        .await
        .unwrap();
    assert!(response.body().is_end_stream(), "an empty Full");
    let (server, _) = scripted(vec![(201, vec![], "{}")]);
    let response = ClientLayer::new()
        .layer(server)
        .oneshot(intent(1))
        .await
        .unwrap();
    assert!(!response.body().is_end_stream());
}
