//! Reading a label body (`LABEL_CONTRACT.md` §2 step 5): the plain body every client sends without serde,
//! anything else by serde, both to the same answers; and the identifier alphabet.

use std::borrow::Cow;

use serde::Deserialize;

use super::InvalidOperation;

/// A label body as parsed: each field borrowed from the body unless it had escapes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Fields<'a> {
    #[serde(borrow)]
    pub(super) request_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) parcel_id: Cow<'a, str>,
}

impl<'a> Fields<'a> {
    /// Label contract §2 step 5: exactly the two fields, each an identifier.
    pub(super) fn parse(body: &'a [u8]) -> Result<Self, InvalidOperation> {
        if let Some(fields) = Self::plain(body) {
            return Ok(fields);
        }
        // Without an escape, what the plain reader refuses serde refuses too (the property
        // test below holds the two to it): serde is read only for what an escape may spell,
        // and a refusal is not a serde error built, formatted and dropped.
        if !body.contains(&b'\\') {
            return Err(InvalidOperation(()));
        }
        // serde fills a struct from an array of its fields in order too; the contract's body
        // is an object.
        let first = body.iter().find(|&&b| !is_json_space(b));
        if first != Some(&b'{') {
            return Err(InvalidOperation(()));
        }
        let fields: Self = serde_json::from_slice(body).map_err(|_| InvalidOperation(()))?;
        if is_identifier(&fields.request_id) && is_identifier(&fields.parcel_id) {
            Ok(fields)
        } else {
            Err(InvalidOperation(()))
        }
    }
}

impl<'a> Fields<'a> {
    /// The body every client sends, read without serde: one object, the two fields in either
    /// order, each value a non-empty string of identifier characters (so valid as read), JSON
    /// whitespace between the tokens. `None` for anything else (escapes, another field, a
    /// second value...), which serde then reads: this accepts only what serde and the
    /// identifier check accept, with the same fields, borrowed from the body.
    pub(super) fn plain(body: &'a [u8]) -> Option<Self> {
        // One UTF-8 check of the whole body, a word at a time; the fields are slices of it.
        let text = std::str::from_utf8(body).ok()?;
        let mut reader = Plain { text, at: 0 };
        reader.token(b'{')?;
        let (first, first_value) = reader.member()?;
        reader.token(b',')?;
        let (second, second_value) = reader.member()?;
        reader.token(b'}')?;
        reader.space();
        if reader.at != text.len() {
            return None;
        }
        let (request_id, parcel_id) = match (first, second) {
            ("request_id", "parcel_id") => (first_value, second_value),
            ("parcel_id", "request_id") => (second_value, first_value),
            _ => return None,
        };
        Some(Self {
            request_id: Cow::Borrowed(request_id),
            parcel_id: Cow::Borrowed(parcel_id),
        })
    }
}

/// JSON's whitespace: space, tab, line feed, carriage return (RFC 8259), nothing else.
pub(super) fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// A reader of [`Fields::plain`]'s shape.
pub(super) struct Plain<'a> {
    pub(super) text: &'a str,
    pub(super) at: usize,
}

impl<'a> Plain<'a> {
    /// Skips JSON whitespace.
    pub(super) fn space(&mut self) {
        while self
            .text
            .as_bytes()
            .get(self.at)
            .is_some_and(|&b| is_json_space(b))
        {
            self.at += 1;
        }
    }

    /// Whitespace, then `byte`.
    pub(super) fn token(&mut self, byte: u8) -> Option<()> {
        self.space();
        self.token_here(byte)
    }

    /// Whitespace, then a non-empty string of identifier characters (no escapes, no quote
    /// inside).
    pub(super) fn string(&mut self) -> Option<&'a str> {
        self.token(b'"')?;
        let start = self.at;
        let rest = self.text.as_bytes().get(start..)?;
        let len = rest
            .iter()
            .position(|&b| !IDENTIFIER[usize::from(b)])
            .unwrap_or(rest.len());
        if len == 0 {
            return None;
        }
        self.at += len;
        let value = self.text.get(start..self.at)?;
        self.token_here(b'"')?;
        Some(value)
    }

    /// `byte`, with no whitespace before it.
    pub(super) fn token_here(&mut self, byte: u8) -> Option<()> {
        (self.text.as_bytes().get(self.at) == Some(&byte)).then(|| self.at += 1)
    }

    /// A name, a colon and a value.
    pub(super) fn member(&mut self) -> Option<(&'a str, &'a str)> {
        let name = self.string()?;
        self.token(b':')?;
        Some((name, self.string()?))
    }
}

/// A validated field: non-empty, only `[A-Za-z0-9_-]`.
pub(super) fn is_identifier(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(is_identifier_byte)
}

/// A byte of an identifier: `[A-Za-z0-9_-]`.
pub(super) fn is_identifier_byte(byte: u8) -> bool {
    IDENTIFIER[usize::from(byte)]
}

/// [`is_identifier_byte`] for every byte, looked up rather than compared.
pub(super) const IDENTIFIER: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
        byte += 1;
    }
    table
};
