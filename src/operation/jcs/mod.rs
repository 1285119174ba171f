//! Canonical JSON (RFC 8785, JCS): a strict parser into a small tree, JSON pointers (RFC 6901)
//! to select or drop members, and the canonical serialisation the fingerprint hashes.
//!
//! Canonical form: no insignificant whitespace; object members sorted by the UTF-16 code
//! units of their names; strings with only the escapes ECMAScript's `JSON.stringify` writes;
//! numbers as ECMAScript writes a double (`1.0` and `1` are both `1`, `1e21` is `1e+21`).
//! Duplicate member names, lone surrogates, numbers out of the double range and nesting deeper
//! than [`MAX_DEPTH`] are refused. One departure from RFC 8785: an integer literal of 16 to 21
//! digits keeps its exact digits ([`Node::Integer`]).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;

mod number;
mod parser;
mod pointer;

use self::number::write_number;
use self::parser::Parser;
pub(crate) use self::pointer::Pointer;

/// The deepest nesting of arrays and objects accepted.
pub(crate) const MAX_DEPTH: usize = 128;

/// A parsed JSON value, objects sorted canonically; its strings and member names borrowed
/// from the body unless they had escapes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node<'a> {
    Null,
    Bool(bool),
    Number(f64),
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    /// Members sorted by the UTF-16 code units of their names, no name twice.
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
    /// An integer literal of 16 to 21 digits, kept exactly. Past 2^53 two such integers can
    /// share a double, and so RFC 8785's canonical form, while a body typed with `u64` reads
    /// two amounts; their own digits keep them apart. Up to 21 digits ECMAScript writes a
    /// double as plain digits too, so an integer a double holds exactly is written the same.
    Integer(&'a str),
    /// An array item dropped from the fingerprint: kept in place so that later pointers still
    /// name the items they named in the document, and skipped when written.
    Removed,
}

/// Why a body is not JSON that has a canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalid {
    Syntax,
    Duplicate,
    Surrogate,
    Number,
    Depth,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Syntax => "the body is not one JSON value",
            Self::Duplicate => "an object has a member name twice",
            Self::Surrogate => "a string has a lone surrogate escape",
            Self::Number => "a number is out of the range of a double",
            Self::Depth => "arrays and objects are nested too deep",
        })
    }
}

/// Parses exactly one JSON value, surrounded by nothing but whitespace.
pub(crate) fn parse(input: &[u8]) -> Result<Node<'_>, Invalid> {
    let text = std::str::from_utf8(input).map_err(|_| Invalid::Syntax)?;
    let mut parser = Parser { input, text, at: 0 };
    let node = parser.value(0)?;
    parser.whitespace();
    if parser.at == input.len() {
        Ok(node)
    } else {
        Err(Invalid::Syntax)
    }
}

/// Orders member names by their UTF-16 code units, as RFC 8785 §3.2.3 asks.
fn utf16_order(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

impl Node<'_> {
    /// Appends the canonical form of this value to `out`.
    pub(crate) fn write_canonical(&self, out: &mut Vec<u8>) {
        match self {
            Self::Null => out.extend_from_slice(b"null"),
            Self::Bool(true) => out.extend_from_slice(b"true"),
            Self::Bool(false) => out.extend_from_slice(b"false"),
            Self::Number(value) => write_number(*value, out),
            Self::Integer(text) => out.extend_from_slice(text.as_bytes()),
            Self::String(text) => write_string(text, out),
            Self::Array(items) => {
                out.push(b'[');
                let kept = items.iter().filter(|item| !matches!(item, Self::Removed));
                for (i, item) in kept.enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_canonical(out);
                }
                out.push(b']');
            }
            Self::Removed => {}
            Self::Object(members) => {
                out.push(b'{');
                for (i, (name, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(name, out);
                    out.push(b':');
                    value.write_canonical(out);
                }
                out.push(b'}');
            }
        }
    }

    /// The value `pointer` names, if there is one.
    pub(crate) fn get(&self, pointer: &Pointer) -> Option<&Self> {
        pointer
            .tokens
            .iter()
            .try_fold(self, |node, token| node.child(token))
    }

    fn child(&self, token: &str) -> Option<&Self> {
        match self {
            Self::Object(members) => members.iter().find(|(name, _)| name == token).map(|m| &m.1),
            Self::Array(items) => items
                .get(array_index(token)?)
                .filter(|item| !matches!(item, Self::Removed)),
            _ => None,
        }
    }

    /// Removes the value `pointer` names, if there is one; the whole document cannot be.
    pub(crate) fn remove(&mut self, pointer: &Pointer) {
        let Some((last, parents)) = pointer.tokens.split_last() else {
            return;
        };
        let mut node = self;
        for token in parents {
            let next = match node {
                Self::Object(members) => members
                    .iter_mut()
                    .find(|(name, _)| name == token)
                    .map(|m| &mut m.1),
                Self::Array(items) => array_index(token).and_then(|i| items.get_mut(i)),
                _ => None,
            };
            match next {
                Some(next) => node = next,
                None => return,
            }
        }
        match node {
            Self::Object(members) => members.retain(|(name, _)| name != last),
            Self::Array(items) => {
                if let Some(item) = array_index(last).and_then(|i| items.get_mut(i)) {
                    *item = Self::Removed;
                }
            }
            _ => {}
        }
    }
}

/// An RFC 6901 array index: `0` or digits without a leading zero.
fn array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

/// A JSON string as `JSON.stringify` writes it.
fn write_string(text: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for byte in text.bytes() {
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0A => out.extend_from_slice(b"\\n"),
            0x0C => out.extend_from_slice(b"\\f"),
            0x0D => out.extend_from_slice(b"\\r"),
            0x00..=0x1F => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(byte >> 4)]);
                out.push(HEX[usize::from(byte & 0xF)]);
            }
            _ => out.push(byte),
        }
    }
    out.push(b'"');
}

/// The canonical form of a JSON text.
pub(crate) fn canonicalize(input: &[u8]) -> Result<Vec<u8>, Invalid> {
    let node = parse(input)?;
    let mut out = Vec::with_capacity(input.len());
    node.write_canonical(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(input: &str) -> String {
        String::from_utf8(canonicalize(input.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn rfc_8785_example() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        assert_eq!(
            canonical(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn members_sort_by_utf16_code_units() {
        // RFC 8785 §3.2.3: "\r" < "1" < "\u0080" < "ö" < "€" < "😀" < "\ufb33".
        let input = r#"{"\ufb33":1,"😀":2,"€":3,"ö":4,"\u0080":5,"1":6,"\r":7}"#;
        assert_eq!(
            canonical(input),
            "{\"\\r\":7,\"1\":6,\"\u{80}\":5,\"ö\":4,\"€\":3,\"😀\":2,\"\u{fb33}\":1}"
        );
    }

    #[test]
    fn refusals() {
        for (input, why) in [
            (r#"{"a":1,"a":2}"#, Invalid::Duplicate),
            (r#"{"a":1,"\u0061":2}"#, Invalid::Duplicate),
            (r#""\ud800""#, Invalid::Surrogate),
            (r#""\udc00""#, Invalid::Surrogate),
            (r#""\ud800\u0041""#, Invalid::Surrogate),
            ("1e400", Invalid::Number),
            ("", Invalid::Syntax),
            ("{} {}", Invalid::Syntax),
            ("01", Invalid::Syntax),
            ("1.", Invalid::Syntax),
            ("-", Invalid::Syntax),
            ("+1", Invalid::Syntax),
            ("[1,]", Invalid::Syntax),
            (r#"{"a":1,}"#, Invalid::Syntax),
            ("\"a\u{1}\"", Invalid::Syntax),
            (r#""\x""#, Invalid::Syntax),
            ("nul", Invalid::Syntax),
            ("NaN", Invalid::Syntax),
            ("'a'", Invalid::Syntax),
        ] {
            assert_eq!(parse(input.as_bytes()), Err(why), "{input}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(parse(deep.as_bytes()), Err(Invalid::Depth));
        let deepest = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(deepest.as_bytes()).is_ok());
        assert_eq!(parse(b"\"\xff\""), Err(Invalid::Syntax));
    }

    #[test]
    fn numbers_in_any_spelling_and_long_integers_exactly() {
        for (text, canonical) in [
            ("9007199254740992", "9007199254740992"),
            ("-0.0", "0"),
            ("0e10", "0"),
            ("0.5e1", "5"),
            ("333333333.33333329", "333333333.3333333"),
            ("0.10000000000000001", "0.1"),
            ("1.00000000000000000001", "1"),
            ("1e-400", "0"),
            ("100000000000000000000", "100000000000000000000"),
            ("-9007199254740992", "-9007199254740992"),
            ("9007199254740993", "9007199254740993"),
            ("18446744073709551615", "18446744073709551615"),
            ("18446744073709551615.0", "18446744073709552000"),
            ("123456789012345678901234567890", "1.2345678901234568e+29"),
            ("1.50", "1.5"),
            ("100E-2", "1"),
            ("0.1", "0.1"),
            ("5e-324", "5e-324"),
            ("1e21", "1e+21"),
            ("1.2345678901234567890e29", "1.2345678901234568e+29"),
        ] {
            let result = canonicalize(text.as_bytes());
            assert_eq!(result.as_deref(), Ok(canonical.as_bytes()), "{text}");
        }
    }

    #[test]
    fn removing_array_items_keeps_the_indices_of_the_document() {
        let mut doc = parse(br#"{"items":["t","a","X"]}"#).unwrap();
        for pointer in ["/items/0", "/items/1"] {
            doc.remove(&Pointer::parse(pointer).unwrap());
        }
        let mut out = Vec::new();
        doc.write_canonical(&mut out);
        assert_eq!(out, br#"{"items":["X"]}"#);
    }

    #[test]
    fn escapes_empty_containers_spaces_and_surrogate_pairs() {
        for (input, output) in [
            (
                r#""\b\f\n\r\t\u0001 \u001F""#,
                r#""\b\f\n\r\t\u0001 \u001f""#,
            ),
            (r#""\ud83d\ude00 \uD83D\uDE00""#, "\"😀 😀\""),
            (r#""\uffff\u0800""#, "\"\u{ffff}\u{800}\""),
            ("{}", "{}"),
            ("[]", "[]"),
            (r#"{ "a" : { } , "b" : [ ] }"#, r#"{"a":{},"b":[]}"#),
            (r#"["a b", " "]"#, r#"["a b"," "]"#),
        ] {
            assert_eq!(canonical(input), output, "{input}");
        }
    }

    #[test]
    fn objects_nest_as_deep_as_arrays() {
        let deep = "{\"a\":".repeat(MAX_DEPTH + 1) + "1" + &"}".repeat(MAX_DEPTH + 1);
        assert_eq!(parse(deep.as_bytes()), Err(Invalid::Depth));
        let deepest = "{\"a\":".repeat(MAX_DEPTH) + "1" + &"}".repeat(MAX_DEPTH);
        assert!(parse(deepest.as_bytes()).is_ok());
        let mixed = "[{\"a\":".repeat(MAX_DEPTH / 2) + "1" + &"}]".repeat(MAX_DEPTH / 2);
        assert!(parse(mixed.as_bytes()).is_ok());
        let over = "[{\"a\":".repeat(MAX_DEPTH / 2 + 1) + "1" + &"}]".repeat(MAX_DEPTH / 2 + 1);
        assert_eq!(parse(over.as_bytes()), Err(Invalid::Depth));
    }

    /// Strings and names without escapes are slices of the body; with escapes, their text.
    #[test]
    fn strings_without_escapes_are_borrowed_from_the_body() {
        let body = br#"{"plain":"text","esc\u0061ped":"a\"b\ncd\u00e9f","n":12345678901234567}"#;
        let Node::Object(members) = parse(body).unwrap() else {
            panic!("an object");
        };
        let borrowed = |text: &Cow<'_, str>| matches!(text, Cow::Borrowed(_));
        let [
            (escaped, Node::String(value)),
            (n, Node::Integer(digits)),
            (plain, Node::String(text)),
        ] = &members[..]
        else {
            panic!("{members:?}");
        };
        assert_eq!(
            (escaped.as_ref(), value.as_ref()),
            ("escaped", "a\"b\ncd\u{e9}f")
        );
        assert!(!borrowed(escaped) && !borrowed(value));
        assert_eq!((plain.as_ref(), text.as_ref()), ("plain", "text"));
        assert!(borrowed(plain) && borrowed(text) && borrowed(n));
        assert_eq!(*digits, "12345678901234567");
        // Within the body itself.
        let within = |part: &str| body.as_ptr_range().contains(&part.as_ptr());
        assert!(within(plain) && within(text) && within(digits));
    }
}
