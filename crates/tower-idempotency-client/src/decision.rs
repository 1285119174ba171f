//! The retry decision: which answers to an attempt are safe to retry with the same key, and
//! when.

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, StatusCode};

/// What to do with an attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send the same request again, with the same key: after the backoff, and not before
    /// `after` when the server said when with `Retry-After`. That wait is no longer than the
    /// cap: a longer one is [`Stop`](Decision::Stop).
    Retry {
        /// The least wait the server asked for, if it asked.
        after: Option<Duration>,
    },
    /// Give this answer to the caller: it is final, or retrying it could do harm.
    Stop,
}

/// Why an attempt got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection could not be made, or was cut before a response came: the request may
    /// or may not have reached the server.
    Connection,
    /// The attempt ran out of its time.
    Timeout,
}

/// The decision for an answer with `status`, `headers` and `body` to a request sent with an
/// `Idempotency-Key` when `keyed`, or without one. The body is read only for a `409`.
///
/// Retried, with the same key:
///
/// - `502`, `503` and `504`: the server or a proxy in front of it could not answer. A `503`'s
///   `Retry-After` is honoured.
/// - `429`, a refused admission: the layer released the key. `Retry-After` is honoured.
/// - `409` when it says the first attempt is still running: the label contract's
///   `{"error":"request_pending"}`, or a problem whose type ends in `request_pending`.
///   `Retry-After` is honoured, as the generic operations send one.
///
/// Never retried: any other answer, such as `400`, `422`, a conflict, other `4xx`, `500` or a
/// success; any answer to a request that had no key, which a retry could create twice; and an
/// answer whose `Retry-After` asks for longer than `cap`, since the server asked for a rest the
/// caller did not allow.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, StatusCode};
/// use tower_idempotency_client::decision::{Decision, decide};
///
/// let cap = Duration::from_secs(30);
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "2".parse().unwrap());
/// assert_eq!(
///     decide(StatusCode::SERVICE_UNAVAILABLE, &headers, b"", true, cap),
///     Decision::Retry { after: Some(Duration::from_secs(2)) }
/// );
/// let pending = br#"{"error":"request_pending"}"#;
/// assert_eq!(
///     decide(StatusCode::CONFLICT, &HeaderMap::new(), pending, true, cap),
///     Decision::Retry { after: None }
/// );
/// assert_eq!(
///     decide(StatusCode::CONFLICT, &headers, pending, true, cap),
///     Decision::Retry { after: Some(Duration::from_secs(2)) }
/// );
/// assert_eq!(
///     decide(StatusCode::CONFLICT, &headers, pending, true, Duration::from_secs(1)),
///     Decision::Stop
/// );
/// assert_eq!(decide(StatusCode::UNPROCESSABLE_ENTITY, &headers, b"", true, cap), Decision::Stop);
/// assert_eq!(decide(StatusCode::SERVICE_UNAVAILABLE, &headers, b"", false, cap), Decision::Stop);
/// ```
pub fn decide(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    keyed: bool,
    cap: Duration,
) -> Decision {
    if !keyed {
        return Decision::Stop;
    }
    match status {
        StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT => Decision::Retry { after: None },
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => honouring(headers, cap),
        StatusCode::CONFLICT if says_pending(body) => honouring(headers, cap),
        _ => Decision::Stop,
    }
}

/// A retry no sooner than the answer's `Retry-After`, if it has one; none if it asks for
/// longer than `cap`.
fn honouring(headers: &HeaderMap, cap: Duration) -> Decision {
    match retry_after(headers, SystemTime::now()) {
        Some(after) if after > cap => Decision::Stop,
        after => Decision::Retry { after },
    }
}

/// The decision for an attempt that got no answer: retried with the same key, since the
/// layer on the server makes a second arrival a replay or a wait, never a second create. A
/// request without a key is not retried: it might have been created.
///
/// ```
/// use tower_idempotency_client::decision::{Decision, Failure, decide_failure};
///
/// assert_eq!(decide_failure(Failure::Timeout, true), Decision::Retry { after: None });
/// assert_eq!(decide_failure(Failure::Connection, false), Decision::Stop);
/// ```
pub fn decide_failure(failure: Failure, keyed: bool) -> Decision {
    match failure {
        Failure::Connection | Failure::Timeout if keyed => Decision::Retry { after: None },
        _ => Decision::Stop,
    }
}

/// The decision for a unary gRPC call that ended with `grpc-status` `code`, sent with an
/// `idempotency-key` metadata entry when `keyed`, or without. 14 `UNAVAILABLE` and 10
/// `ABORTED`, the layer's *request pending*, are retried; `OK` and every other code are final,
/// among them 3 `INVALID_ARGUMENT` and 9 `FAILED_PRECONDITION`, a conflict.
///
/// ```
/// use tower_idempotency_client::decision::{Decision, decide_grpc};
///
/// assert_eq!(decide_grpc(14, true), Decision::Retry { after: None });
/// assert_eq!(decide_grpc(9, true), Decision::Stop);
/// ```
pub fn decide_grpc(code: u32, keyed: bool) -> Decision {
    const ABORTED: u32 = 10;
    const UNAVAILABLE: u32 = 14;
    match code {
        ABORTED | UNAVAILABLE if keyed => Decision::Retry { after: None },
        _ => Decision::Stop,
    }
}

/// The wait a `Retry-After` header asks for, read at `now`: delay-seconds or an HTTP-date, as
/// RFC 9110 §10.2.3 defines them; none for a missing or unreadable header, zero for a date
/// passed.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Whether a `409`'s body says the first attempt is still running: the label contract's
/// `{"error":"request_pending"}`, or an RFC 9457 problem whose type ends in
/// `request_pending`, under any base.
fn says_pending(body: &[u8]) -> bool {
    // Any JSON in the members: a string with escapes, or an `error` that is not a string,
    // is read all the same.
    #[derive(serde::Deserialize)]
    struct Reply {
        #[serde(default)]
        error: serde_json::Value,
        #[serde(default, rename = "type")]
        kind: serde_json::Value,
    }
    const PENDING: &str = "request_pending";
    let Ok(reply) = serde_json::from_slice::<Reply>(body) else {
        return false;
    };
    let named = reply.error.as_str() == Some(PENDING);
    let typed = reply.kind.as_str().is_some_and(|kind| {
        kind.strip_suffix(PENDING)
            .is_some_and(|base| base.is_empty() || base.ends_with(['#', '/']))
    });
    named || typed
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_secs(30);

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, value.parse().unwrap());
        headers
    }

    /// Every status, keyed and not: only the safe ones are retried, and only with a key.
    #[test]
    fn the_status_table() {
        let retried = [502, 503, 504, 429];
        for code in 100..=599u16 {
            let Ok(status) = StatusCode::from_u16(code) else {
                continue;
            };
            let keyed = decide(status, &HeaderMap::new(), b"", true, CAP);
            let expected = if retried.contains(&code) {
                Decision::Retry { after: None }
            } else {
                Decision::Stop
            };
            assert_eq!(keyed, expected, "{code}");
            let pending = br#"{"error":"request_pending"}"#;
            assert_eq!(
                decide(status, &with_retry_after("1"), pending, false, CAP),
                Decision::Stop,
                "{code} without a key"
            );
        }
    }

    /// A `409` is retried only when it says the first attempt is running.
    #[test]
    fn a_conflict_is_final_and_a_pending_first_attempt_is_retried() {
        let decide_409 = |body: &str| {
            decide(
                StatusCode::CONFLICT,
                &HeaderMap::new(),
                body.as_bytes(),
                true,
                CAP,
            )
        };
        let retry = Decision::Retry { after: None };
        for pending in [
            r#"{"error":"request_pending"}"#,
            r#"{"type":"https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#request_pending","status":409}"#,
            r#"{"type":"https://api.example.com/problems/request_pending"}"#,
            r#"{"type":"request_pending"}"#,
            r#"{"type":"https:\/\/api.example.com\/problems\/request_pending"}"#,
            r#"{"error":7,"type":"https://x/request_pending"}"#,
        ] {
            assert_eq!(decide_409(pending), retry, "{pending}");
        }
        for other in [
            r#"{"error":"idempotency_conflict"}"#,
            // The key's replay window passed: final, never a new key for it.
            r#"{"type":"https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#key_expired","status":409}"#,
            r#"{"error":"key_expired"}"#,
            r#"{"type":"https://api.example.com/problems/idempotency_conflict"}"#,
            r#"{"type":"https://api.example.com/problems/not_request_pending"}"#,
            r#"{"type":"request_pending/x"}"#,
            r#"{"error":"request_pending_soon"}"#,
            r#"{"error":7}"#,
            "request_pending",
            "",
            "[]",
        ] {
            assert_eq!(decide_409(other), Decision::Stop, "{other}");
        }
    }

    /// `Retry-After` is honoured on `503`, `429` and a pending first attempt's `409`, as
    /// seconds or as a date, and capped.
    #[test]
    fn retry_after_is_honoured_and_capped() {
        let pending = br#"{"error":"request_pending"}"#;
        for status in [
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::CONFLICT,
        ] {
            let decide = |status, headers: &HeaderMap, _: &[u8], keyed, cap| {
                decide(status, headers, pending, keyed, cap)
            };
            assert_eq!(
                decide(status, &with_retry_after("2"), b"", true, CAP),
                Decision::Retry {
                    after: Some(Duration::from_secs(2))
                }
            );
            assert_eq!(
                decide(status, &with_retry_after("30"), b"", true, CAP),
                Decision::Retry { after: Some(CAP) }
            );
            // Longer than the caller allows: the answer is the caller's.
            assert_eq!(
                decide(status, &with_retry_after("31"), b"", true, CAP),
                Decision::Stop
            );
            assert_eq!(
                decide(status, &with_retry_after("soon"), b"", true, CAP),
                Decision::Retry { after: None }
            );
        }
        // Other retried answers carry no wait of the server's.
        assert_eq!(
            decide(
                StatusCode::BAD_GATEWAY,
                &with_retry_after("2"),
                b"",
                true,
                CAP
            ),
            Decision::Retry { after: None }
        );
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let date = |value: &str| retry_after(&with_retry_after(value), now);
        assert_eq!(
            date("Sun, 06 Nov 1994 08:49:47 GMT"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(date("Sun, 06 Nov 1994 08:49:00 GMT"), Some(Duration::ZERO));
        assert_eq!(date(" 5 "), Some(Duration::from_secs(5)));
        assert_eq!(date("-1"), None);
        assert_eq!(date("1.5"), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    /// No answer: retried with a key, never without.
    #[test]
    fn a_lost_answer_is_retried_only_with_a_key() {
        for failure in [Failure::Connection, Failure::Timeout] {
            assert_eq!(
                decide_failure(failure, true),
                Decision::Retry { after: None }
            );
            assert_eq!(decide_failure(failure, false), Decision::Stop);
        }
    }

    /// Every gRPC code, keyed and not.
    #[test]
    fn the_grpc_table() {
        for code in 0..=20 {
            let expected = if code == 10 || code == 14 {
                Decision::Retry { after: None }
            } else {
                Decision::Stop
            };
            assert_eq!(decide_grpc(code, true), expected, "{code}");
            assert_eq!(decide_grpc(code, false), Decision::Stop, "{code}");
        }
    }
}
