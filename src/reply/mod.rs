//! What the layer answers itself: the [`Rejection`]s each operation writes in its own format,
//! the [`Outcome`] it reports, and stored responses turned into replies.

use http::Response;
use http::header::RETRY_AFTER;

use crate::body::ResponseBody;
use crate::operation::Operation;
pub use crate::outcome::{Invalid, Outcome};
pub use crate::rejection::Rejection;
use crate::rejection::Retry;

/// The header that advertises how long a completed create is replayed, in whole seconds
/// (rounded down, at least one), on every answer to a guarded request: `Idempotency-TTL: 86400` for the
/// default 24 hours, the name the IETF draft's issue #49 proposes. The layer takes the window
/// from its store ([`Store::replay_window`](crate::store::Store::replay_window)) and sends
/// none when the store keeps records until they are forgotten; see
/// [`IdempotencyLayer::window_header`](crate::IdempotencyLayer::window_header).
pub const IDEMPOTENCY_TTL: http::HeaderName = http::HeaderName::from_static("idempotency-ttl");

/// The header in which a retry says when its intent was first sent, an HTTP date (OASIS
/// repeatable requests): the crate's client layer sends it on every retry, and the layer reads
/// it when asked to refuse retries past the replay window
/// ([`IdempotencyLayer::refuse_past_window`](crate::IdempotencyLayer::refuse_past_window)).
pub const REPEATABILITY_FIRST_SENT: http::HeaderName =
    http::HeaderName::from_static("repeatability-first-sent");

/// The replay marker header, sent on replays only when
/// [`IdempotencyLayer::mark_replays`](crate::IdempotencyLayer::mark_replays) is on:
/// `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

pub use tower_idempotency_core::IDEMPOTENT_BODY_OMITTED;

impl Rejection {
    /// The rejection as the response `operation` writes, with its outcome attached, and
    /// `retry_after` (the pending key's, or the refusals') where the operation sends one.
    pub(crate) fn into_response<O: Operation, B>(
        self,
        operation: &O,
        retry_after: &RetryAfter,
    ) -> Response<ResponseBody<B>> {
        let mut response = operation.reply(&self);
        let value = match self.declared().retry {
            Retry::Pending => Some(&retry_after.pending),
            Retry::Refused => Some(&retry_after.refused),
            Retry::Never => None,
        };
        if let (Some(value), Some(header)) = (value, response.headers_mut().get_mut(RETRY_AFTER)) {
            header.clone_from(value);
        }
        let outcome = self.outcome(response.status());
        response.map(|body| ResponseBody::full(body).with_outcome(outcome))
    }
}

/// A layer's `Retry-After` values, in seconds: a pending key's and the refusals'.
#[derive(Debug)]
pub(crate) struct RetryAfter {
    pub(crate) pending: http::HeaderValue,
    pub(crate) refused: http::HeaderValue,
}

/// The table of `operation`'s replies in Markdown, as the docs show it: the body whole, or
/// for a problem its `type` fragment and title.
/// A refusal's name in the reply tables: what it carries named, not shown.
#[cfg(test)]
pub(crate) fn case_name(rejection: &Rejection) -> String {
    match rejection {
        Rejection::InvalidRequest(_) => "InvalidRequest(detail)".to_owned(),
        Rejection::KeyExpired(_) => "KeyExpired(tombstone)".to_owned(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
pub(crate) fn table(operation: &impl Operation) -> String {
    use std::fmt::Write;
    let problems = operation.reply(&Rejection::Conflict).headers()[http::header::CONTENT_TYPE]
        == crate::problem::PROBLEM_JSON;
    let mut table = if problems {
        String::from(
            "| case | status | `type` (after `#`) | `title` | headers |\n|---|---|---|---|---|\n",
        )
    } else {
        String::from("| case | status | body | headers |\n|---|---|---|---|\n")
    };
    for rejection in Rejection::every() {
        let response = operation.reply(&rejection);
        let case = case_name(&rejection);
        let headers: Vec<String> = response
            .headers()
            .iter()
            .map(|(name, value)| format!("`{}: {}`", name, value.to_str().unwrap_or("?")))
            .collect();
        let body = if problems {
            let problem: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            let kind = problem["type"].as_str().unwrap();
            format!(
                "`{}` | {}",
                &kind[kind.find('#').unwrap() + 1..],
                problem["title"].as_str().unwrap()
            )
        } else {
            format!("`{}`", String::from_utf8_lossy(response.body()))
        };
        // Writing into a String cannot fail.
        let _ = writeln!(
            table,
            "| {case} | {} | {body} | {} |",
            response.status().as_u16(),
            headers.join(" "),
        );
    }
    table
}

/// A stored response as a reply, value for value.
pub(crate) fn stored<B>(
    stored: crate::store::StoredResponse,
    outcome: Outcome,
) -> Response<ResponseBody<B>> {
    let (status, headers, body, trailers) = stored.into_parts_with_trailers();
    let body = ResponseBody::full_with_trailers(body, trailers).with_outcome(outcome);
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::{JsonOperation, LabelContract};

    /// The tables in the docs are the code's own replies, rendered, and the problem page's
    /// sections the refusal table's own words. `UPDATE_REPLY_TABLES=1` writes them anew after
    /// a change of a reply or a refusal, in `src/reply/` and in the README.
    #[test]
    fn documented_tables_are_the_replies() {
        let update = std::env::var_os("UPDATE_REPLY_TABLES").is_some();
        let mut readme = include_str!("../../README.md").to_owned();
        for (name, file, rendered) in [
            ("label.md", include_str!("label.md"), table(&LabelContract)),
            (
                "problem.md",
                include_str!("problem.md"),
                table(&JsonOperation::new()),
            ),
            (
                "problem-types.md",
                include_str!("problem-types.md"),
                problem_types(),
            ),
            ("grpc.md", include_str!("grpc.md"), grpc_table()),
        ] {
            if update {
                let path = format!("{}/src/reply/{name}", env!("CARGO_MANIFEST_DIR"));
                std::fs::write(path, &rendered).unwrap();
            } else {
                assert_eq!(file, rendered, "{name}: run with UPDATE_REPLY_TABLES=1");
            }
            // The README shows the HTTP tables; gRPC's, its summary.
            if matches!(name, "problem-types.md" | "grpc.md") {
                continue;
            }
            if update {
                readme = with_table(&readme, &rendered);
            }
            assert!(
                readme.contains(&rendered),
                "README.md shows {name} as it is: run with UPDATE_REPLY_TABLES=1"
            );
        }
        if update {
            let path = format!("{}/README.md", env!("CARGO_MANIFEST_DIR"));
            std::fs::write(path, readme).unwrap();
        }
    }

    /// The problem page's sections: each code's heading, then the doc comment of its first
    /// row in the refusal table.
    fn problem_types() -> String {
        let mut page = String::new();
        for rejection in Rejection::every() {
            let row = rejection.declared();
            let heading = format!("# {}\n", row.code);
            if page.contains(&heading) {
                continue;
            }
            page.push_str(&heading);
            for line in row.about.lines() {
                page.push_str(line.strip_prefix(' ').unwrap_or(line));
                page.push('\n');
            }
        }
        page
    }

    /// `GrpcOperation`'s refusals: each case's `grpc-status`, by number and name, and its
    /// `grpc-message`.
    fn grpc_table() -> String {
        use std::fmt::Write;
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        let mut table = String::from("| case | `grpc-status` | `grpc-message` |\n|---|---|---|\n");
        for rejection in Rejection::every() {
            let response = crate::operation::GrpcOperation::new().reply(&rejection);
            let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
            let status = header("grpc-status");
            let name = NAMES[status.parse::<usize>().unwrap()];
            let case = case_name(&rejection);
            // Writing into a String cannot fail.
            let _ = writeln!(
                table,
                "| {case} | {status} `{name}` | `{}` |",
                header("grpc-message")
            );
        }
        table
    }

    /// `readme` with the table that starts with `rendered`'s header line replaced by
    /// `rendered`.
    fn with_table(readme: &str, rendered: &str) -> String {
        let header = rendered.lines().next().unwrap();
        let start = readme
            .find(&format!("{header}\n"))
            .unwrap_or_else(|| panic!("README.md has no table headed {header}"));
        let end = readme[start..]
            .split_inclusive('\n')
            .take_while(|line| line.starts_with('|'))
            .map(str::len)
            .sum::<usize>()
            + start;
        format!("{}{rendered}{}", &readme[..start], &readme[end..])
    }

    /// A table in the README is replaced whole, and only it.
    #[test]
    fn a_table_in_the_readme_is_replaced_whole() {
        let readme = "before\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\nafter\n";
        let rendered = "| a | b |\n|---|---|\n| 5 | 6 |\n";
        assert_eq!(
            with_table(readme, rendered),
            "before\n| a | b |\n|---|---|\n| 5 | 6 |\nafter\n"
        );
    }
}
