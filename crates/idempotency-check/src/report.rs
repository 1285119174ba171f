//! What a check found: a verdict for each scenario, what a client would suffer where one
//! failed, and the exchanges that show it; as text, or as JSON ([`Report::to_json`]).

use std::fmt;

/// A scenario's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The endpoint did what the draft asks.
    Pass,
    /// It did not: see the scenario's `suffering` and evidence.
    Fail,
    /// The scenario does not apply (the endpoint does not require keys, say).
    NotApplicable,
}

impl Verdict {
    /// `pass`, `fail` or `not_applicable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::NotApplicable => "not_applicable",
        }
    }
}

/// One request and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// What was sent, in a line: `POST /payments key=… body=…`.
    pub request: String,
    /// The answer's status, or `None` if there was none (see `error`).
    pub status: Option<u16>,
    /// The answer's HTTP version (`HTTP/1.1`, `HTTP/2.0`), or empty if there was none.
    pub version: String,
    /// The answer's headers a client relies on (`Location`, `ETag`, `Content-Type`,
    /// `Retry-After`, `Idempotent-Replayed`, `Idempotency-Key`), as `name: value`.
    pub headers: Vec<String>,
    /// The answer's body, as text (lossy), cut at 512 bytes.
    pub body: String,
    /// Why there was no answer.
    pub error: Option<String>,
}

/// One scenario's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// Its name, as `--only` and `--skip` take it.
    pub name: &'static str,
    /// Its verdict.
    pub verdict: Verdict,
    /// What was found, in a sentence.
    pub summary: String,
    /// Where it failed, what a client would suffer; empty otherwise.
    pub suffering: String,
    /// The exchanges that show it.
    pub evidence: Vec<Exchange>,
}

/// Every scenario's outcome, in the order they ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The scenarios run.
    pub scenarios: Vec<Scenario>,
}

impl Report {
    /// Whether no scenario failed.
    pub fn passed(&self) -> bool {
        self.scenarios.iter().all(|s| s.verdict != Verdict::Fail)
    }

    /// The scenario named `name`, if it ran.
    pub fn scenario(&self, name: &str) -> Option<&Scenario> {
        self.scenarios.iter().find(|s| s.name == name)
    }

    /// The report as JSON:
    ///
    /// ```json
    /// {"passed": false,
    ///  "scenarios": [{"name": "conflict", "verdict": "fail",
    ///                 "summary": "…", "suffering": "…",
    ///                 "evidence": [{"request": "POST /payments key=… body=…", "status": 201,
    ///                               "version": "HTTP/1.1",
    ///                               "headers": ["location: /payments/1"], "body": "…",
    ///                               "error": null}]}]}
    /// ```
    ///
    /// `verdict` is `pass`, `fail` or `not_applicable`; `status` and `error` are `null` when
    /// absent, `version` empty; `suffering` is empty unless the scenario failed.
    pub fn to_json(&self) -> serde_json::Value {
        let scenarios: Vec<_> = self
            .scenarios
            .iter()
            .map(|s| {
                let evidence: Vec<_> = s
                    .evidence
                    .iter()
                    .map(|e| {
                        serde_json::json!({
                            "request": e.request,
                            "status": e.status,
                            "version": e.version,
                            "headers": e.headers,
                            "body": e.body,
                            "error": e.error,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "name": s.name,
                    "verdict": s.verdict.as_str(),
                    "summary": s.summary,
                    "suffering": s.suffering,
                    "evidence": evidence,
                })
            })
            .collect();
        serde_json::json!({ "passed": self.passed(), "scenarios": scenarios })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.scenarios {
            writeln!(f, "{:<15} {}: {}", s.verdict.as_str(), s.name, s.summary)?;
            if s.verdict == Verdict::Fail {
                writeln!(f, "    a client suffers: {}", s.suffering)?;
                for e in &s.evidence {
                    match (e.status, &e.error) {
                        (Some(status), error) => {
                            writeln!(f, "    {} -> {status} {}", e.request, e.body)?;
                            if let Some(error) = error {
                                writeln!(f, "        (the answer could not be read: {error})")?;
                            }
                            for header in &e.headers {
                                writeln!(f, "        {header}")?;
                            }
                        }
                        (None, Some(error)) => {
                            writeln!(f, "    {} -> no answer: {error}", e.request)?
                        }
                        (None, None) => writeln!(f, "    {} -> no answer", e.request)?,
                    }
                }
            }
        }
        let failed = self
            .scenarios
            .iter()
            .filter(|s| s.verdict == Verdict::Fail)
            .count();
        writeln!(f, "{} scenarios, {failed} failed", self.scenarios.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_report_shows_failures_with_their_suffering_and_evidence() {
        let exchange = |status: Option<u16>, error: Option<&str>| Exchange {
            request: "POST http://h/p key=k body={}".to_owned(),
            status,
            version: "HTTP/1.1".to_owned(),
            headers: vec!["location: /p/1".to_owned()],
            body: "{}".to_owned(),
            error: error.map(str::to_owned),
        };
        let report = Report {
            scenarios: vec![
                Scenario {
                    name: "conflict",
                    verdict: Verdict::Pass,
                    summary: "refused".to_owned(),
                    suffering: String::new(),
                    evidence: vec![exchange(Some(422), None)],
                },
                Scenario {
                    name: "create_then_replay",
                    verdict: Verdict::Fail,
                    summary: "another body".to_owned(),
                    suffering: "a client reads another answer".to_owned(),
                    evidence: vec![
                        exchange(Some(201), None),
                        exchange(Some(201), Some("the body is over 1048576 bytes")),
                        exchange(None, Some("connection refused")),
                    ],
                },
                Scenario {
                    name: "other_endpoint",
                    verdict: Verdict::NotApplicable,
                    summary: "no other endpoint".to_owned(),
                    suffering: String::new(),
                    evidence: Vec::new(),
                },
            ],
        };
        assert!(!report.passed());
        let expected = [
            "pass            conflict: refused",
            "fail            create_then_replay: another body",
            "    a client suffers: a client reads another answer",
            "    POST http://h/p key=k body={} -> 201 {}",
            "        location: /p/1",
            "    POST http://h/p key=k body={} -> 201 {}",
            "        (the answer could not be read: the body is over 1048576 bytes)",
            "        location: /p/1",
            "    POST http://h/p key=k body={} -> no answer: connection refused",
            "not_applicable  other_endpoint: no other endpoint",
            "3 scenarios, 1 failed",
            "",
        ];
        assert_eq!(report.to_string(), expected.join("\n"));
        let json = report.to_json();
        assert_eq!(json["passed"], false);
        assert_eq!(
            json["scenarios"][1]["evidence"][2]["status"],
            serde_json::Value::Null
        );
        assert_eq!(json["scenarios"][2]["verdict"], "not_applicable");
    }
}
