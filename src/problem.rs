//! RFC 9457 problem details: the replies of the generic operations
//! ([`JsonOperation`](crate::JsonOperation), [`RawOperation`](https://docs.rs/tower-idempotency/latest/tower_idempotency/operation/struct.RawOperation.html), and any
//! [`Operation`](https://docs.rs/tower-idempotency/latest/tower_idempotency/operation/trait.Operation.html) that keeps the default [`reply`](https://docs.rs/tower-idempotency/latest/tower_idempotency/operation/trait.Operation.html#method.reply)),
//! per draft-ietf-httpapi-idempotency-key-header.
//!
//! Every body is `{"type":…,"title":…,"status":…,"detail":…}` with
//! `Content-Type: application/problem+json`, and an `errors` member as well for a refusal
//! about one member of the body ([invalid_request](#invalid_request)).
//!
//! # Problem types
//!
//! The `type` of each case is a base followed by the case's name: by default
//! [`DEFAULT_TYPE_BASE`], this page, so that `type` is the address of the case's heading below
//! (`…/tower_idempotency/problem/index.html#idempotency_conflict`). Clients match on these
//! URIs, so they are part of the crate's contract: the base and the names below do not change
//! between releases (a test holds every one, and this page's place in the crate). To point
//! clients at your own API's documentation, give the generic operations a base of your own,
//! [`JsonOperation::problem_type_base`](crate::JsonOperation::problem_type_base) (and
//! [`RawOperation`'s](https://docs.rs/tower-idempotency/latest/tower_idempotency/operation/struct.RawOperation.html#method.problem_type_base)):
//! `https://api.example.com/problems/` gives `https://api.example.com/problems/idempotency_conflict`.
//!
#![doc = include_str!("reply/problem.md")]
//!
#![doc = include_str!("reply/problem-types.md")]

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response};

use crate::outcome::Invalid;
use crate::rejection::Rejection;
use crate::rejection::default_base;
use crate::store::Tombstone;

/// The media type of every problem reply.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// What every problem type starts with unless an operation is given a base of its own: this
/// page, so that a type is the address of its case's heading. Stable across releases.
pub const DEFAULT_TYPE_BASE: &str = default_base!();

/// The problem reply for `rejection`, its type under `base` (the default's when `None`).
pub(crate) fn reply_under(rejection: &Rejection, base: Option<&str>) -> Response<Bytes> {
    let mut response = reply(rejection);
    if let Some(base) = base {
        let body = response.body_mut();
        *body = rebase(body, base);
    }
    response
}

/// `body` with its type under `base` rather than [`DEFAULT_TYPE_BASE`].
fn rebase(body: &Bytes, base: &str) -> Bytes {
    let start = concat!(r#"{"type":""#, default_base!());
    let Some(rest) = body.strip_prefix(start.as_bytes()) else {
        return body.clone();
    };
    // The base as a JSON string without its closing quote; the case's name and the rest
    // follow as they were.
    let quoted = serde_json::to_string(base).unwrap_or_default();
    let open = quoted.strip_suffix('"').unwrap_or(&quoted);
    let mut rebased = Vec::with_capacity(r#"{"type":"#.len() + open.len() + rest.len());
    rebased.extend_from_slice(br#"{"type":"#);
    rebased.extend_from_slice(open.as_bytes());
    rebased.extend_from_slice(rest);
    Bytes::from(rebased)
}

/// The problem reply for `rejection`: its row of the [refusal table](crate::rejection) as it is,
/// the detail of an invalid request the operation's own.
pub(crate) fn reply(rejection: &Rejection) -> Response<Bytes> {
    let declared = rejection.declared();
    let body = match rejection {
        Rejection::InvalidRequest(why) => invalid(why),
        Rejection::KeyExpired(Some(tombstone)) => expired(tombstone),
        _ => Bytes::from_static(declared.problem),
    };
    let mut response = Response::new(body);
    *response.status_mut() = declared.status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if let Some(seconds) = declared.retry.default_value() {
        headers.insert(RETRY_AFTER, HeaderValue::from_static(seconds));
    }
    response
}

/// The one problem with a detail of the operation's: an invalid body, and the member it is
/// about in `errors` (RFC 9457 §3.2's extension) when it names one.
fn invalid(why: &Invalid) -> Bytes {
    // Serialising a string cannot fail.
    let json = |text: &str| serde_json::to_string(text).unwrap_or_default();
    let detail = json(&why.to_string());
    let errors = match why.pointer() {
        Some(pointer) => format!(
            r#","errors":[{{"pointer":{},"detail":{}}}]"#,
            json(pointer),
            json(why.detail())
        ),
        None => String::new(),
    };
    let row = &crate::rejection::INVALID_REQUEST;
    Bytes::from(format!(
        r#"{{"type":"{}{}","title":"{}","status":{},"detail":{detail}{errors}}}"#,
        default_base!(),
        row.code,
        row.title,
        row.status.as_u16(),
    ))
}

/// The expired key's problem with what the store remembers of its operation: when it
/// completed (`completed_at`, an HTTP date, as the crate's other times on the wire) and the
/// created resource (`location`, when it had one that is text).
fn expired(tombstone: &Tombstone) -> Bytes {
    let declared = crate::rejection::KEY_EXPIRED.problem;
    // The row's body without its closing brace, then the members.
    let open = &declared[..declared.len() - 1];
    let completed_at = httpdate::fmt_http_date(tombstone.completed_at());
    let location = tombstone
        .location()
        .and_then(|location| {
            // Serialising a string cannot fail.
            let text = serde_json::to_string(location.to_str().ok()?).unwrap_or_default();
            Some(format!(r#","location":{text}"#))
        })
        .unwrap_or_default();
    let mut body = Vec::with_capacity(open.len() + 64 + location.len());
    body.extend_from_slice(open);
    body.extend_from_slice(br#","completed_at":""#);
    body.extend_from_slice(completed_at.as_bytes());
    body.push(b'"');
    body.extend_from_slice(location.as_bytes());
    body.push(b'}');
    Bytes::from(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Invalid;

    /// Every case of a problem reply, once.
    fn cases() -> Vec<Rejection> {
        Rejection::every()
    }

    fn type_of(response: &Response<Bytes>) -> String {
        let problem: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        problem["type"].as_str().unwrap().to_owned()
    }

    /// The problem types are a contract with clients: each is pinned here, and the default
    /// base is the address of this module's page, so moving the module fails this test.
    /// An expired key's problem carries what the store remembers as members, at any time a
    /// tombstone holds (the latest included: an HTTP date's last year), and a `Location` that
    /// is not text is left out.
    #[test]
    fn an_expired_keys_problem_says_when_and_where() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let location = HeaderValue::from_static("/payments/7");
        let tombstone = Tombstone::new(at, http::StatusCode::CREATED, Some(location));
        let body = expired(&tombstone);
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["completed_at"], "Tue, 14 Nov 2023 22:13:20 GMT");
        assert_eq!(problem["location"], "/payments/7");
        assert_eq!(problem["status"], 409);
        let far = std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::from(u32::MAX) * 100);
        let binary = HeaderValue::from_bytes(b"/caf\xe9").unwrap();
        let late = Tombstone::new(far, http::StatusCode::CREATED, Some(binary));
        let problem: serde_json::Value = serde_json::from_slice(&expired(&late)).unwrap();
        assert_eq!(problem["completed_at"], "Fri, 31 Dec 9999 23:59:59 GMT");
        assert!(problem.get("location").is_none(), "{problem}");
    }

    #[test]
    fn problem_types_do_not_change() {
        let page = "https://docs.rs/tower-idempotency/latest/tower_idempotency/problem/index.html#";
        assert_eq!(DEFAULT_TYPE_BASE, page);
        assert_eq!(
            format!(
                "https://docs.rs/tower-idempotency/latest/{}/index.html#",
                module_path!()
                    .trim_end_matches("::tests")
                    .replace("::", "/")
            ),
            page,
            "the problem types point at this module's page"
        );
        let names = [
            "not_found",
            "method_not_allowed",
            "unsupported_media_type",
            "payload_too_large",
            "invalid_idempotency_key",
            "invalid_request",
            "scope_required",
            "idempotency_conflict",
            "request_pending",
            "not_admitted",
            "not_admitted",
            "store_unavailable",
            "create_failed",
            "response_too_large",
            "outcome_unknown",
            "key_expired",
        ];
        let types: Vec<_> = cases().iter().map(|case| type_of(&reply(case))).collect();
        let pinned: Vec<_> = names.iter().map(|name| format!("{page}{name}")).collect();
        assert_eq!(types, pinned);
        // Each name is a heading of this page.
        assert!(include_str!("problem.rs").contains(concat!(
            "\n#![doc = include_str!(\"reply/",
            "problem-types.md\")]\n"
        )));
        let headings = include_str!("reply/problem-types.md");
        for name in names {
            assert!(headings.contains(&format!("# {name}\n")), "{name}");
        }
    }

    /// A base of the operation's own replaces the default one in every type, and only there;
    /// a base that needs escaping in JSON is escaped.
    #[test]
    fn a_base_of_ones_own_prefixes_every_type() {
        let pointed = Rejection::InvalidRequest(Invalid::at("/a", "why"));
        for case in cases().into_iter().chain([pointed]) {
            let default = reply(&case);
            let own = reply_under(&case, Some("https://api.example.com/problems/"));
            let name = type_of(&default).rsplit('#').next().unwrap().to_owned();
            assert_eq!(
                type_of(&own),
                format!("https://api.example.com/problems/{name}")
            );
            assert_eq!(own.status(), default.status());
            assert_eq!(own.headers(), default.headers());
            let mut own_problem: serde_json::Value = serde_json::from_slice(own.body()).unwrap();
            let mut default_problem: serde_json::Value =
                serde_json::from_slice(default.body()).unwrap();
            own_problem["type"] = serde_json::Value::Null;
            default_problem["type"] = serde_json::Value::Null;
            assert_eq!(own_problem, default_problem, "only the type differs");
            let odd = reply_under(&case, Some("urn:\"odd\"\\"));
            assert_eq!(type_of(&odd), format!("urn:\"odd\"\\{name}"));
            assert_eq!(reply_under(&case, None).body(), default.body());
        }
    }
}
