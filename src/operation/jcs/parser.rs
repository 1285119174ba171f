//! The strict JSON parser into the small tree the canonical form is written from.

use std::borrow::Cow;

use super::{Invalid, MAX_DEPTH, Node, utf16_order};

pub(super) struct Parser<'a> {
    pub(super) input: &'a [u8],
    /// The input, checked to be UTF-8 once.
    pub(super) text: &'a str,
    pub(super) at: usize,
}

impl<'a> Parser<'a> {
    pub(super) fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    pub(super) fn next(&mut self) -> Result<u8, Invalid> {
        let byte = self.peek().ok_or(Invalid::Syntax)?;
        self.at += 1;
        Ok(byte)
    }

    pub(super) fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    pub(super) fn literal(&mut self, word: &[u8], node: Node<'a>) -> Result<Node<'a>, Invalid> {
        if self.input[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(node)
        } else {
            Err(Invalid::Syntax)
        }
    }

    pub(super) fn value(&mut self, depth: usize) -> Result<Node<'a>, Invalid> {
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

    pub(super) fn array(&mut self, depth: usize) -> Result<Node<'a>, Invalid> {
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

    pub(super) fn object(&mut self, depth: usize) -> Result<Node<'a>, Invalid> {
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
    pub(super) fn plain_run(&mut self) {
        while let Some(b) = self.peek() {
            if b == b'"' || b == b'\\' || b < 0x20 {
                break;
            }
            self.at += 1;
        }
    }

    /// A string (at its opening quote): borrowed from the input unless it has escapes.
    pub(super) fn string(&mut self) -> Result<Cow<'a, str>, Invalid> {
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
    pub(super) fn unicode_escape(&mut self) -> Result<char, Invalid> {
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

    pub(super) fn hex4(&mut self) -> Result<u32, Invalid> {
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

    pub(super) fn number(&mut self) -> Result<Node<'a>, Invalid> {
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

    pub(super) fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    pub(super) fn required_digits(&mut self) -> Result<(), Invalid> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(Invalid::Syntax);
        }
        self.digits();
        Ok(())
    }
}
