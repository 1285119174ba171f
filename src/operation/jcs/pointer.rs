//! JSON pointers (RFC 6901), to select or drop members of a body.

/// An RFC 6901 JSON pointer: `""` is the whole document, `/a/b` the member `b` of the member
/// `a`, `~1` stands for `/` and `~0` for `~` in a name, a number for an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pointer {
    text: String,
    pub(super) tokens: Vec<String>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::jcs::{Node, parse};

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
