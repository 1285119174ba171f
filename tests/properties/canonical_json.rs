//! A property oracle for the RFC 8785 fingerprint: random JSON documents, written out in random
//! ways (member order, whitespace, string escapes, number spellings), canonicalize to the same
//! bytes and are one operation through the layer; any change of a value is another.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use common::payments::{json_request, payment_create, send};
use proptest::prelude::*;
use tower_idempotency::operation::canonical_json;
use tower_idempotency::reply::Outcome;
use tower_idempotency::{IdempotencyLayer, JsonOperation, MemoryStore};

/// A JSON value with unique member names.
#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        (-1_000_000i64..1_000_000).prop_map(|n| n as f64),
        prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL | prop::num::f64::ZERO,
        (-1000i32..1000, 1u32..7).prop_map(|(n, d)| f64::from(n) / f64::from(10u32.pow(d))),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,6}",
        ".{0,6}",
        prop::collection::vec(
            prop::sample::select(vec![
                '"', '\\', '/', '\u{0}', '\u{8}', '\u{1f}', '\u{7f}', 'é', '€', '😀', '\u{fb33}',
                '\u{2028}'
            ]),
            0..5
        )
        .prop_map(|chars| chars.into_iter().collect()),
    ]
}

fn value() -> impl Strategy<Value = J> {
    let leaf = prop_oneof![
        Just(J::Null),
        any::<bool>().prop_map(J::Bool),
        number().prop_map(J::Num),
        text().prop_map(J::Str),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(J::Arr),
            prop::collection::btree_map(text(), inner, 0..6)
                .prop_map(|members: BTreeMap<String, J>| J::Obj(members.into_iter().collect())),
        ]
    })
}

/// A tiny deterministic generator for the writing choices.
struct Choices(u64);

impl Choices {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn space(out: &mut String, choices: &mut Choices) {
    for _ in 0..choices.next(3) {
        out.push([' ', '\t', '\n', '\r'][choices.next(4) as usize]);
    }
}

fn write_string(text: &str, out: &mut String, choices: &mut Choices) {
    out.push('"');
    for c in text.chars() {
        let must_escape = c == '"' || c == '\\' || (c as u32) < 0x20;
        match (must_escape, choices.next(3)) {
            (false, 0 | 1) => out.push(c),
            (true, 0) if c == '"' || c == '\\' => {
                out.push('\\');
                out.push(c);
            }
            (_, 1) if c == '/' => out.push_str("\\/"),
            (_, 1) if c == '\n' => out.push_str("\\n"),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if choices.next(2) == 0 {
                        out.push_str(&format!("\\u{unit:04x}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            }
        }
    }
    out.push('"');
}

fn write_number(x: f64, out: &mut String, choices: &mut Choices) {
    let spelled = match choices.next(4) {
        0 => format!("{x}"),
        1 => format!("{x:e}"),
        2 => format!("{x:E}"),
        _ if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.1}"),
        _ => format!("{x:?}"),
    };
    // Rust writes "inf"/"NaN" never here (finite values only) and "-0" for negative zero.
    out.push_str(&spelled);
}

/// Writes `value` as JSON, choosing member order, whitespace, escapes and number spellings.
fn write(value: &J, out: &mut String, choices: &mut Choices) {
    space(out, choices);
    match value {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Num(x) => write_number(*x, out, choices),
        J::Str(s) => write_string(s, out, choices),
        J::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out, choices);
            }
            space(out, choices);
            out.push(']');
        }
        J::Obj(members) => {
            let mut order: Vec<usize> = (0..members.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, choices.next(i as u64 + 1) as usize);
            }
            out.push('{');
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                space(out, choices);
                write_string(&members[i].0, out, choices);
                space(out, choices);
                out.push(':');
                write(&members[i].1, out, choices);
            }
            space(out, choices);
            out.push('}');
        }
    }
    space(out, choices);
}

fn written(value: &J, seed: u64) -> String {
    let mut out = String::new();
    write(value, &mut out, &mut Choices(seed | 1));
    out
}

/// Counts the values in `value`, itself included.
fn size(value: &J) -> usize {
    1 + match value {
        J::Arr(items) => items.iter().map(size).sum(),
        J::Obj(members) => members.iter().map(|(_, v)| size(v)).sum(),
        _ => 0,
    }
}

/// Changes the `at`-th value (pre-order) so that it means something else.
fn change(value: &mut J, at: &mut usize) -> bool {
    if *at == 0 {
        *value = match value {
            J::Null => J::Num(0.0),
            J::Bool(b) => J::Bool(!*b),
            J::Num(x) if *x == 0.0 => J::Num(1.0),
            J::Num(x) => J::Num(-*x),
            J::Str(s) => J::Str(format!("{s}x")),
            J::Arr(items) => {
                let mut items = items.clone();
                items.push(J::Null);
                J::Arr(items)
            }
            J::Obj(members) => {
                let mut members = members.clone();
                let name = members.iter().map(|(n, _)| n.as_str()).collect::<String>() + "+";
                members.push((name, J::Null));
                J::Obj(members)
            }
        };
        return true;
    }
    *at -= 1;
    match value {
        J::Arr(items) => items.iter_mut().any(|item| change(item, at)),
        J::Obj(members) => members.iter_mut().any(|(_, v)| change(v, at)),
        _ => false,
    }
}

/// A document with every number as a double, as I-JSON reads it (serde_json tells `0` from
/// `0.0`; RFC 8785 does not).
fn as_doubles(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Value::Array(items) => Value::Array(items.into_iter().map(as_doubles).collect()),
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(k, v)| (k, as_doubles(v)))
                .collect(),
        ),
        other => other,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any two writings of one document have one canonical form, itself canonical, and it
    /// reads back as the same document.
    #[test]
    fn every_writing_of_a_document_has_one_canonical_form(value in value(), a: u64, b: u64) {
        let first = canonical_json(written(&value, a).as_bytes()).unwrap();
        let second = canonical_json(written(&value, b).as_bytes()).unwrap();
        prop_assert_eq!(&first, &second);
        prop_assert_eq!(canonical_json(&first).unwrap(), first.clone(), "canonical is a fixed point");
        let read_back: serde_json::Value = serde_json::from_slice(&first).unwrap();
        let original: serde_json::Value = serde_json::from_str(&written(&value, a)).unwrap();
        prop_assert_eq!(as_doubles(read_back), as_doubles(original));
    }

    /// Changing any one value changes the canonical form.
    #[test]
    fn any_change_of_a_value_changes_the_canonical_form(value in value(), at: prop::sample::Index, seed: u64) {
        let mut changed = value.clone();
        prop_assert!(change(&mut changed, &mut at.index(size(&value))));
        let before = canonical_json(written(&value, seed).as_bytes()).unwrap();
        let after = canonical_json(written(&changed, seed).as_bytes()).unwrap();
        prop_assert_ne!(before, after);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Through the layer: another writing is a replay; a changed value is a conflict.
    #[test]
    fn through_the_layer_a_rewriting_replays_and_a_change_conflicts(value in value(), at: prop::sample::Index, a: u64, b: u64) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        runtime.block_on(async {
            let layer = IdempotencyLayer::new(MemoryStore::new(), JsonOperation::new()).global_keys();
            let service = tower::Layer::layer(&layer, payment_create(Arc::new(AtomicUsize::new(0)), Duration::ZERO));
            let first = send(&service, json_request("POST", "/documents", Some("doc"), &written(&value, a))).await;
            assert_eq!(first.outcome, Some(Outcome::Created), "{:?}", first.body);
            let again = send(&service, json_request("POST", "/documents", Some("doc"), &written(&value, b))).await;
            assert_eq!(again.outcome, Some(Outcome::Replay));
            let mut changed = value.clone();
            change(&mut changed, &mut at.index(size(&value)));
            let other = send(&service, json_request("POST", "/documents", Some("doc"), &written(&changed, a))).await;
            assert_eq!(other.outcome, Some(Outcome::Conflict));
        });
    }
}

/// The fingerprints a JSON operation gives are what stores hold: they must not change from
/// one version to the next, or a retry after an upgrade is a conflict. Vectors computed
/// independently of the crate: SHA-256 over length-prefixed parts (method, path and query,
/// media type, the RFC 8785 body; with `fingerprint_only`, each member's pointer and value
/// digested alone, their hexadecimal digests in order).
#[test]
fn json_fingerprints_are_stable_vectors() {
    use tower_idempotency::operation::Operation;
    let (parts, ()) = http::Request::post("/p")
        .header("content-type", "application/json")
        .header("idempotency-key", "k")
        .body(())
        .unwrap()
        .into_parts();
    let body = bytes::Bytes::from_static(br#"{ "note":"a", "currency":"EUR", "amount":1 }"#);
    let whole = JsonOperation::new().parse(&parts, &body).unwrap();
    assert_eq!(
        whole.fingerprint.to_hex().as_str(),
        "1c832382a8e5f85890c0d17c8de5281025dd18bedaab26245c8ebbad053e164b"
    );
    let only = JsonOperation::new()
        .fingerprint_only(["/amount", "/currency"])
        .unwrap()
        .parse(&parts, &body)
        .unwrap();
    assert_eq!(
        only.fingerprint.to_hex().as_str(),
        "311b22dd1dd634a107011fa263b9b8a6ebf0c148824c038411fca0c4f4e635f3"
    );
}
