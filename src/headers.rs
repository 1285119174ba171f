//! Which headers of a created response are stored and replayed.
//!
//! Hop-by-hop headers describe one connection, not the response, and are never stored:
//! `Connection`, every header `Connection` names, `Keep-Alive`, `Proxy-Connection`,
//! `Transfer-Encoding`, `TE`, `Trailer` and `Upgrade`. Headers configured with
//! [`IdempotencyLayer::exclude_headers`](crate::IdempotencyLayer::exclude_headers) (a
//! `Set-Cookie`, say) are not stored either. Since the reply to a new request is the stored
//! response, they are not in that reply either: the first answer and every replay are the same.

use http::header::{self, HeaderMap, HeaderName};

/// The hop-by-hop headers of RFC 9110 §7.6.1, and the common non-standard ones.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Removes from `headers` everything that must not be stored.
pub(crate) fn retain_storable(headers: &mut HeaderMap, excluded: &[HeaderName]) {
    // One pass over the few headers a created response has; most have nothing to remove.
    let storable = headers
        .keys()
        .all(|name| !HOP_BY_HOP.contains(name) && !excluded.contains(name));
    if storable {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(excluded).chain(&named) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_named_and_excluded_headers_are_dropped() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-session-hint"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("x-session-hint", "abc"),
            ("set-cookie", "session=1"),
            ("etag", "\"a\""),
            ("location", "/labels/1"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        headers.append("etag", HeaderValue::from_static("\"b\""));
        retain_storable(&mut headers, &[header::SET_COOKIE]);
        let mut names: Vec<_> = headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["etag", "location"]);
        let etags: Vec<_> = headers.get_all("etag").iter().collect();
        assert_eq!(
            etags,
            ["\"a\"", "\"b\""],
            "values of one name keep their order"
        );
    }
}
