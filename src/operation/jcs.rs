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

struct Parser<'a> {
    input: &'a [u8],
    /// The input, checked to be UTF-8 once.
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    fn next(&mut self) -> Result<u8, Invalid> {
        let byte = self.peek().ok_or(Invalid::Syntax)?;
        self.at += 1;
        Ok(byte)
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &[u8], node: Node<'a>) -> Result<Node<'a>, Invalid> {
        if self.input[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(node)
        } else {
            Err(Invalid::Syntax)
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node<'a>, Invalid> {
        self.whitespace();
        match self.peek().ok_or(Invalid::Syntax)? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(Node::String),
            b't' => self.literal(b"true", Node::Bool(true)),
            b'f' => self.literal(b"false", Node::Bool(false)),
            b'n' => self.literal(b"null", Node::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(Invalid::Syntax),
        }
    }

    fn array(&mut self, depth: usize) -> Result<Node<'a>, Invalid> {
        if depth > MAX_DEPTH {
            return Err(Invalid::Depth);
        }
        self.at += 1; // [
        let mut items = Vec::new();
        self.whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Node::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.whitespace();
            match self.next()? {
                b',' => {}
                b']' => return Ok(Node::Array(items)),
                _ => return Err(Invalid::Syntax),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Node<'a>, Invalid> {
        if depth > MAX_DEPTH {
            return Err(Invalid::Depth);
        }
        self.at += 1; // {
        let mut members = Vec::new();
        self.whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Node::Object(members));
        }
        loop {
            self.whitespace();
            if self.peek() != Some(b'"') {
                return Err(Invalid::Syntax);
            }
            let name = self.string()?;
            self.whitespace();
            if self.next()? != b':' {
                return Err(Invalid::Syntax);
            }
            members.push((name, self.value(depth)?));
            self.whitespace();
            match self.next()? {
                b',' => {}
                b'}' => break,
                _ => return Err(Invalid::Syntax),
            }
        }
        members.sort_by(|a, b| utf16_order(&a.0, &b.0));
        if members.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return Err(Invalid::Duplicate);
        }
        Ok(Node::Object(members))
    }

    /// The run of characters that need no unescaping, from here.
    fn plain_run(&mut self) {
        while let Some(b) = self.peek() {
            if b == b'"' || b == b'\\' || b < 0x20 {
                break;
            }
            self.at += 1;
        }
    }

    /// A string (at its opening quote): borrowed from the input unless it has escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, Invalid> {
        self.at += 1; // "
        let start = self.at;
        self.plain_run();
        if self.peek() == Some(b'"') {
            // Between two quotes, so on character boundaries.
            let text = self.text.get(start..self.at).ok_or(Invalid::Syntax)?;
            self.at += 1;
            return Ok(Cow::Borrowed(text));
        }
        let mut out = self.input[start..self.at].to_vec();
        loop {
            match self.next()? {
                b'"' => break,
                b'\\' => {
                    let escaped = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(Invalid::Syntax),
                    };
                    let mut buffer = [0; 4];
                    out.extend_from_slice(escaped.encode_utf8(&mut buffer).as_bytes());
                }
                _ => return Err(Invalid::Syntax), // a control character
            }
            let run = self.at;
            self.plain_run();
            out.extend_from_slice(&self.input[run..self.at]);
        }
        // The input is valid UTF-8 and escapes add whole characters.
        String::from_utf8(out)
            .map(Cow::Owned)
            .map_err(|_| Invalid::Syntax)
    }

    /// The character of `\uXXXX` (the `\u` read), with its low surrogate if it is a high one.
    fn unicode_escape(&mut self) -> Result<char, Invalid> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if self.next()? != b'\\' || self.next()? != b'u' {
                    return Err(Invalid::Surrogate);
                }
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(Invalid::Surrogate);
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(Invalid::Surrogate),
            _ => first,
        };
        char::from_u32(code).ok_or(Invalid::Surrogate)
    }

    fn hex4(&mut self) -> Result<u32, Invalid> {
        let digits = self
            .input
            .get(self.at..self.at + 4)
            .ok_or(Invalid::Syntax)?;
        let text = std::str::from_utf8(digits).map_err(|_| Invalid::Syntax)?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Invalid::Syntax);
        }
        self.at += 4;
        u32::from_str_radix(text, 16).map_err(|_| Invalid::Syntax)
    }

    fn number(&mut self) -> Result<Node<'a>, Invalid> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return Err(Invalid::Syntax),
        }
        let is_integer = !matches!(self.peek(), Some(b'.' | b'e' | b'E'));
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.required_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.required_digits()?;
        }
        // The grammar above admits only ASCII.
        let text = self.text.get(start..self.at).ok_or(Invalid::Syntax)?;
        let digits = text.trim_start_matches('-').len();
        if is_integer && (16..=21).contains(&digits) {
            return Ok(Node::Integer(text));
        }
        let value: f64 = text.parse().map_err(|_| Invalid::Syntax)?;
        if value.is_finite() {
            Ok(Node::Number(value))
        } else {
            Err(Invalid::Number)
        }
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn required_digits(&mut self) -> Result<(), Invalid> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(Invalid::Syntax);
        }
        self.digits();
        Ok(())
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

/// A finite double as ECMAScript's `Number.prototype.toString` writes it (RFC 8785 §3.2.2.3).
pub(crate) fn write_number(value: f64, out: &mut Vec<u8>) {
    if value == 0.0 {
        out.push(b'0'); // and -0 too
        return;
    }
    if value < 0.0 {
        out.push(b'-');
    }
    let magnitude = value.abs();
    if let Some(integer) = small_integer(magnitude) {
        write_decimal(integer, out);
        return;
    }
    // Any other double as ECMAScript's `Number.prototype.toString` writes it: the shortest
    // digits that read back as the same double, plain up to 21 digits, else `d.ddde±x`
    // (ryu-js, ECMAScript's algorithm on the stack).
    let mut buffer = ryu_js::Buffer::new();
    out.extend_from_slice(buffer.format_finite(magnitude).as_bytes());
}

/// `magnitude` as an integer, if it is one below 2^53: such an integer is its own shortest
/// digits, since the digits of any shorter decimal that read back as it would be another
/// integer, at least 1 away.
fn small_integer(magnitude: f64) -> Option<u64> {
    (magnitude < 9_007_199_254_740_992.0 && magnitude.fract() == 0.0).then_some(magnitude as u64)
}

/// `value` in decimal digits.
fn write_decimal(mut value: u64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// An RFC 6901 JSON pointer: `""` is the whole document, `/a/b` the member `b` of the member
/// `a`, `~1` stands for `/` and `~0` for `~` in a name, a number for an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pointer {
    text: String,
    tokens: Vec<String>,
}

impl Pointer {
    /// Parses a pointer; `None` if it is neither empty nor starts with `/`, or has a `~` not
    /// followed by `0` or `1`.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        if text.is_empty() {
            return Some(Self {
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let rest = text.strip_prefix('/')?;
        let tokens = rest
            .split('/')
            .map(|token| {
                let mut out = String::with_capacity(token.len());
                let mut chars = token.chars();
                while let Some(c) = chars.next() {
                    if c != '~' {
                        out.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return None,
                    }
                }
                Some(out)
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            text: text.to_owned(),
            tokens,
        })
    }

    /// The pointer as written.
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }
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

    fn number(bits: u64) -> String {
        let mut out = Vec::new();
        write_number(f64::from_bits(bits), &mut out);
        String::from_utf8(out).unwrap()
    }

    /// RFC 8785 Appendix B: IEEE 754 doubles and their canonical text.
    #[test]
    fn numbers_as_ecmascript_writes_them() {
        for (bits, text) in [
            (0x0000_0000_0000_0000, "0"),
            (0x8000_0000_0000_0000, "0"),
            (0x0000_0000_0000_0001, "5e-324"),
            (0x8000_0000_0000_0001, "-5e-324"),
            (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
            (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
            (0x4340_0000_0000_0000, "9007199254740992"),
            (0xc340_0000_0000_0000, "-9007199254740992"),
            (0x4430_0000_0000_0000, "295147905179352830000"),
            (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
            (0x44b5_2d02_c7e1_4af6, "1e+23"),
            (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
            (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
            (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
            (0x444b_1ae4_d6e2_ef50, "1e+21"),
            (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
            (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
            (0x41b3_de43_5555_5553, "333333333.3333332"),
            (0x41b3_de43_5555_5554, "333333333.33333325"),
            (0x41b3_de43_5555_5555, "333333333.3333333"),
            (0x41b3_de43_5555_5556, "333333333.3333334"),
            (0x41b3_de43_5555_5557, "333333333.33333343"),
            (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
            // Two shortest digit strings equally near (…117.2 and …117.3 for …117.25):
            // ECMAScript takes the even one, as V8 writes it.
            (
                (2_291_324_119_468_469_f64 / 4.0).to_bits(),
                "572831029867117.2",
            ),
            (
                (-2_291_324_119_468_469_f64 / 4.0).to_bits(),
                "-572831029867117.2",
            ),
        ] {
            assert_eq!(number(bits), text, "{bits:#018x}");
        }
    }

    /// Integers below 2^53 are written from their digits; 2^53 and past, and fractions, as
    /// any other double.
    #[test]
    fn small_integers_are_their_digits() {
        assert_eq!(small_integer(1.0), Some(1));
        assert_eq!(small_integer(1250.0), Some(1250));
        assert_eq!(
            small_integer(9_007_199_254_740_991.0),
            Some(9_007_199_254_740_991)
        );
        assert_eq!(small_integer(9_007_199_254_740_992.0), None);
        assert_eq!(small_integer(1e300), None);
        assert_eq!(small_integer(0.5), None);
        assert_eq!(small_integer(2.5), None);
        assert_eq!(small_integer(f64::INFINITY), None);
    }

    /// The number writer as it was before ryu-js, through `String`s (Rust's shortest
    /// round-trip digits placed as ECMAScript places them): what ryu-js must write, so that no
    /// fingerprint changes.
    fn reference(value: f64) -> String {
        if value == 0.0 {
            return "0".into();
        }
        let sign = if value < 0.0 { "-" } else { "" };
        let scientific = format!("{:e}", value.abs());
        let (mantissa, exponent) = scientific.split_once('e').unwrap();
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        let (k, n) = (digits.len() as i64, exponent.parse::<i64>().unwrap() + 1);
        let body = if k <= n && n <= 21 {
            format!("{digits}{}", "0".repeat((n - k) as usize))
        } else if 0 < n && n <= 21 {
            format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
        } else if -6 < n && n <= 0 {
            format!("0.{}{digits}", "0".repeat((-n) as usize))
        } else {
            let rest = if k > 1 {
                format!(".{}", &digits[1..])
            } else {
                String::new()
            };
            let sign = if n > 0 { '+' } else { '-' };
            format!("{}{rest}e{sign}{}", &digits[..1], (n - 1).abs())
        };
        format!("{sign}{body}")
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(4096))]
        /// Every finite double, and every integer a double holds exactly, is written as the
        /// reference writes it, but where two shortest digit strings are equally near the
        /// double: there the reference took either, and ECMAScript takes the one whose last
        /// digit is even (Number::toString, step 5). Both read back as the double, with as
        /// many digits.
        #[test]
        fn numbers_are_written_as_the_reference_writes_them(
            bits in proptest::num::u64::ANY,
            integer in -(1i64 << 53)..=(1i64 << 53),
            shift in 0u32..64,
        ) {
            for value in [
                f64::from_bits(bits),
                integer as f64,
                (integer >> (shift % 54)) as f64,
                integer as f64 * 2f64.powi(shift as i32),
                integer as f64 / 2f64.powi(shift as i32),
            ] {
                if !value.is_finite() {
                    continue;
                }
                let mut out = Vec::new();
                write_number(value, &mut out);
                let ours = String::from_utf8(out).unwrap();
                let old = reference(value);
                if ours != old {
                    proptest::prop_assert_eq!(ours.len(), old.len());
                    proptest::prop_assert_eq!(ours.parse::<f64>().unwrap(), value);
                    proptest::prop_assert_eq!(old.parse::<f64>().unwrap(), value);
                    let last = |text: &str| {
                        let digits = text.split('e').next().unwrap_or_default();
                        digits.bytes().rfind(u8::is_ascii_digit).unwrap_or_default()
                    };
                    proptest::prop_assert_eq!(last(&ours) % 2, 0, "{} against {}", ours, old);
                    proptest::prop_assert_eq!(last(&ours).abs_diff(last(&old)), 1);
                }
            }
        }
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

    #[test]
    fn pointers_through_arrays_and_past_index_nine() {
        let mut doc = parse(br#"{"items":[0,1,2,3,4,5,6,7,8,9,{"ts":1,"sku":"a"}]}"#).unwrap();
        fn at<'a>(doc: &Node<'a>, p: &str) -> Option<Node<'a>> {
            doc.get(&Pointer::parse(p).unwrap()).cloned()
        }
        assert_eq!(at(&doc, "/items/10/sku"), Some(Node::String("a".into())));
        assert_eq!(at(&doc, "/items/9"), Some(Node::Number(9.0)));
        doc.remove(&Pointer::parse("/items/10/ts").unwrap());
        let mut out = Vec::new();
        doc.write_canonical(&mut out);
        assert_eq!(out, br#"{"items":[0,1,2,3,4,5,6,7,8,9,{"sku":"a"}]}"#);
    }

    #[test]
    fn pointers() {
        let doc = parse(br#"{"a":{"b/c":[10,{"~d":true}]},"e":null}"#).unwrap();
        let at = |p: &str| doc.get(&Pointer::parse(p).unwrap()).cloned();
        assert_eq!(at(""), Some(doc.clone()));
        assert_eq!(at("/a/b~1c/0"), Some(Node::Number(10.0)));
        assert_eq!(at("/a/b~1c/1/~0d"), Some(Node::Bool(true)));
        assert_eq!(at("/a/b~1c/01"), None);
        assert_eq!(at("/a/b~1c/2"), None);
        assert_eq!(at("/e"), Some(Node::Null));
        assert_eq!(at("/e/x"), None);
        for bad in ["a", "/~", "/~2"] {
            assert_eq!(Pointer::parse(bad), None, "{bad}");
        }
        let mut edited = doc.clone();
        edited.remove(&Pointer::parse("/a/b~1c/0").unwrap());
        assert_eq!(edited.get(&Pointer::parse("/a/b~1c/0").unwrap()), None);
        edited.remove(&Pointer::parse("/e").unwrap());
        edited.remove(&Pointer::parse("/missing/x").unwrap());
        edited.remove(&Pointer::parse("").unwrap());
        let mut out = Vec::new();
        edited.write_canonical(&mut out);
        assert_eq!(out, br#"{"a":{"b/c":[{"~d":true}]}}"#);
    }
}
