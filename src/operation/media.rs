//! The request's media type: one `Content-Type` value whose parameters parse.

use http::HeaderMap;
use http::header::CONTENT_TYPE;

/// The media type of the one `Content-Type` value, trimmed, if the value parses (parameters
/// allowed); `None` if it is missing, repeated or unparsable.
pub(crate) fn media_type(headers: &HeaderMap) -> Option<&str> {
    let value = crate::headers::single(headers, &CONTENT_TYPE)?;
    // The value nearly every client sends, without the general parse.
    if value.as_bytes() == b"application/json" {
        return Some("application/json");
    }
    let value = value.to_str().ok()?;
    let (media_type, mut parameters) = match value.split_once(';') {
        Some((media_type, parameters)) => (media_type, Some(parameters)),
        None => (value, None),
    };
    while let Some(rest) = parameters {
        parameters = parse_parameter(rest)?;
    }
    Some(media_type.trim())
}

/// Label contract §2 step 3 (`LABEL_CONTRACT.md`), which the JSON operations share: the media type is `application/json`, compared case-insensitively,
/// parameters allowed; missing or unparsable fails.
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    media_type(headers).is_some_and(|media| media.eq_ignore_ascii_case("application/json"))
}

/// `application/json` or any `application/…+json` (RFC 6839), case-insensitively.
pub(crate) fn is_json_family(headers: &HeaderMap) -> bool {
    media_type(headers).is_some_and(|media| {
        let media = media.as_bytes();
        media.len() > 12
            && media[..12].eq_ignore_ascii_case(b"application/")
            && (media[12..].eq_ignore_ascii_case(b"json")
                || (media.len() > 17 && media[media.len() - 5..].eq_ignore_ascii_case(b"+json")))
    })
}

/// Parses one `name=value` parameter (value a token or a quoted string) at the start of
/// `text`; returns what follows the next `;`, or `None` inside `Some` at the end.
#[allow(clippy::option_option)]
fn parse_parameter(text: &str) -> Option<Option<&str>> {
    let text = text.trim_start_matches([' ', '\t']);
    if text.is_empty() {
        return Some(None); // a trailing `;` is ignored
    }
    let (name, rest) = text.split_once('=')?;
    if name.is_empty() || !name.bytes().all(is_token) {
        return None;
    }
    let rest = if let Some(quoted) = rest.strip_prefix('"') {
        let mut escaped = false;
        let mut end = None;
        for (i, b) in quoted.bytes().enumerate() {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        &quoted[end? + 1..]
    } else {
        let len = rest.bytes().take_while(|&b| is_token(b)).count();
        if len == 0 {
            return None;
        }
        &rest[len..]
    };
    let rest = rest.trim_start_matches([' ', '\t']);
    if rest.is_empty() {
        Some(None)
    } else {
        rest.strip_prefix(';').map(Some)
    }
}

/// An RFC 9110 token character.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn content_type(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn media_types() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=\"utf-8\"",
            " application/json ; charset=utf-8 ; q=1",
            "application/json;",
            r#"application/json; x="a\"b;c""#,
            r#"application/json; x="\\"; charset=utf-8"#,
        ] {
            assert!(is_json(&content_type(ok)), "{ok}");
        }
        for bad in [
            "",
            "text/plain",
            "application/json-patch+json",
            "application/jsonx",
            "application/json; charset",
            "application/json; =utf-8",
            "application/json; charset=\"utf-8",
            "application/json; charset=utf 8",
            "application/json, text/plain",
            r#"application/json; x="a\"b"#,
            r#"application/json; x="a"b"#,
        ] {
            assert!(!is_json(&content_type(bad)), "{bad}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn json_family() {
        for ok in [
            "application/json",
            "application/problem+json; charset=utf-8",
            "Application/Merge-Patch+JSON",
        ] {
            assert!(is_json_family(&content_type(ok)), "{ok}");
        }
        for bad in [
            "application/+json",
            "text/json",
            "application/jsonx",
            "application/json+xml",
            "application/x+json; =",
            "application/",
        ] {
            assert!(!is_json_family(&content_type(bad)), "{bad}");
        }
        assert!(!is_json_family(&HeaderMap::new()));
    }
}
