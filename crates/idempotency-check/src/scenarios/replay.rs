//! Replays: a create and its retry, a conflicting body, the same JSON re-serialised.

use super::*;

impl Run<'_> {
    /// A first request creates; its retry replays it: the same status, body and headers.
    pub(super) async fn create_then_replay(&mut self) -> Scenario {
        let name = "create_then_replay";
        let (key, n, first, created) = match self.first_create(name).await {
            Ok(first) => first,
            Err(scenario) => return scenario,
        };
        let values = Values { key: &key, n };
        let (second, replay) = self.send(&values, Key::One(&key), None).await;
        let evidence = vec![first, second];
        if !self.distinct().await {
            return indistinct(name, evidence);
        }
        let Some(replay) = replay else {
            return fail(
                name,
                "the retry got no answer",
                "a client that retries gets no answer",
                evidence,
            );
        };
        let mut differences = Vec::new();
        if replay.status != created.status {
            differences.push(format!(
                "status {} instead of {}",
                replay.status, created.status
            ));
        }
        if replay.body != created.body {
            differences.push("another body".to_owned());
        }
        for name in &KEPT {
            if replay
                .headers
                .get_all(name)
                .iter()
                .ne(created.headers.get_all(name).iter())
            {
                differences.push(format!("another {name}"));
            }
        }
        if differences.is_empty() {
            let marker = if replay.headers.contains_key("idempotent-replayed") {
                ", marked Idempotent-Replayed"
            } else {
                ""
            };
            return pass(
                name,
                format!(
                    "created {}, the retry replayed it byte for byte{marker}",
                    created.status
                ),
                evidence,
            );
        }
        let lost_location = created.headers.contains_key(header::LOCATION)
            && !replay.headers.contains_key(header::LOCATION);
        let suffering = if lost_location {
            "a client whose first answer was lost retries and does not learn where its resource is"
        } else {
            "a client whose first answer was lost retries and reads another answer than the create's"
        };
        fail(
            name,
            &format!("the retry's answer differs: {}", differences.join(", ")),
            suffering,
            evidence,
        )
    }

    /// The key with another body is refused (`422` per the draft), and the key still replays
    /// its first request.
    pub(super) async fn conflict(&mut self) -> Scenario {
        let name = "conflict";
        let key = self.key(name);
        let first_values = Values {
            key: &key,
            n: self.n(),
        };
        let other_values = Values {
            key: &key,
            n: self.n(),
        };
        let (first, created) = self.send(&first_values, Key::One(&key), None).await;
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
        let (second, other) = self.send(&other_values, Key::One(&key), None).await;
        let (third, again) = self.send(&first_values, Key::One(&key), None).await;
        let evidence = vec![first, second, third];
        let Some(other) = other else {
            return fail(
                name,
                "the other body got no answer",
                "a client cannot tell a reused key",
                evidence,
            );
        };
        if other.is_success() {
            let (summary, suffering) = if other.same_resource(&created) {
                (
                    format!(
                        "another body under the key was answered {} with the first request's result",
                        other.status
                    ),
                    "a client that reuses a key by mistake is told its request succeeded, and it never ran",
                )
            } else {
                (
                    format!(
                        "another body under the key was answered {}, created anew",
                        other.status
                    ),
                    "a key reused with another body creates a second resource",
                )
            };
            return fail(name, &summary, suffering, evidence);
        }
        let unchanged = again
            .as_ref()
            .is_some_and(|again| again.is_success() && again.same_resource(&created));
        if !unchanged {
            return fail(
                name,
                "after the refused body, the first request no longer replays",
                "a client's retry after another client's mistake loses its answer",
                evidence,
            );
        }
        let summary = if other.status == 422 {
            "another body under the key was refused with 422, and the key still replays".to_owned()
        } else {
            format!(
                "another body under the key was refused with {}, not the draft's 422; the key still replays",
                other.status
            )
        };
        pass(name, summary, evidence)
    }

    /// The same JSON body re-serialised (members reordered, spaces added) is a replay, or is
    /// noted as compared by bytes.
    pub(super) async fn reordered_json(&mut self) -> Scenario {
        let name = "reordered_json";
        let key = self.key(name);
        let values = Values {
            key: &key,
            n: self.n(),
        };
        let body = expand(&self.target.body, &values);
        let Some(reordered) = reordered(&body) else {
            return not_applicable(
                name,
                "the body is not a JSON object with two members or more",
                Vec::new(),
            );
        };
        let (first, created) = self.send(&values, Key::One(&key), None).await;
        let Some(created) = self.created(&created) else {
            return not_created(name, first);
        };
        let (second, replay) = self.send(&values, Key::One(&key), Some(&reordered)).await;
        let evidence = vec![first, second];
        let distinct = self.distinct().await;
        match replay {
            Some(replay) if replay.is_success() && replay.same_resource(&created) && !distinct => {
                indistinct(name, evidence)
            }
            Some(replay) if replay.is_success() && replay.same_resource(&created) => pass(
                name,
                "the same JSON, reordered and re-spaced, replayed the create".to_owned(),
                evidence,
            ),
            Some(replay) if !replay.is_success() => not_applicable(
                name,
                &format!(
                    "the same JSON reordered was refused with {}: the server compares bytes, so a client must resend its exact bytes",
                    replay.status
                ),
                evidence,
            ),
            Some(replay) if !replay.same_resource(&created) => fail(
                name,
                "the same JSON reordered created anew",
                "a client whose library re-serialises its retry creates a second resource",
                evidence,
            ),
            _ => fail(
                name,
                "the same JSON reordered got another answer than the create's",
                "a client whose library re-serialises its retry reads another answer",
                evidence,
            ),
        }
    }
}
