//! Which headers of a created response are stored and replayed, and the one value of a
//! request header that must appear once.
//!
//! Hop-by-hop headers describe one connection, not the response, and are never stored:
//! `Connection`, every header `Connection` names, `Keep-Alive`, `Proxy-Connection`,
//! `Transfer-Encoding`, `TE`, `Trailer` and `Upgrade`. Headers configured with
//! [`IdempotencyLayer::exclude_headers`](crate::IdempotencyLayer::exclude_headers) (a
//! `Set-Cookie`, say) are not stored either. Since the reply to a new request is the stored
//! response, they are not in that reply either: the first answer and every replay are the same.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The most header values (`HeaderMap::len`) a request may have for [`single`] to look at
/// each in turn rather than through the map's index: up to it, a pass over a few names
/// costs less than hashing the name, probing and comparing it does. Either way the answer is
/// the same.
const SCANNED: usize = 8;

/// The value of `name` in `headers` if it appears exactly once; `None` if it is missing or
/// repeated.
pub(crate) fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    if headers.len() <= SCANNED {
        only(headers.iter().filter(|(n, _)| *n == name).map(|(_, v)| v))
    } else {
        only(headers.get_all(name).iter())
    }
}

/// The one item of `items`, if it has exactly one.
fn only<T>(mut items: impl Iterator<Item = T>) -> Option<T> {
    match (items.next(), items.next()) {
        (Some(item), None) => Some(item),
        _ => None,
    }
}

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

/// The layer's own mark of a compact record (`reply::IDEMPOTENT_BODY_OMITTED`), which only the
/// layer writes: a create's response carrying it (passed on from an upstream) would be taken
/// for a record whose body is still to stream.
const BODY_OMITTED: HeaderName = HeaderName::from_static("idempotent-body-omitted");

/// Removes from `headers` everything that must not be stored.
pub(crate) fn retain_storable(headers: &mut HeaderMap, excluded: &[HeaderName]) {
    // One pass over the few headers a created response has; most have nothing to remove.
    let storable = headers.keys().all(|name| {
        !HOP_BY_HOP.contains(name) && !excluded.contains(name) && *name != BODY_OMITTED
    });
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
    headers.remove(BODY_OMITTED);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one value of a name is found among few headers and among many, wherever it stands,
    /// whether the name is standard or not; a missing or repeated name has none.
    #[test]
    fn a_single_value_is_found_among_few_headers_and_many() {
        let key = HeaderName::from_static("idempotency-key");
        for others in [0, 1, SCANNED - 1, SCANNED, SCANNED + 1, 40] {
            for name in [header::CONTENT_TYPE, key.clone()] {
                let filler = |headers: &mut HeaderMap, n: usize| {
                    for i in 0..n {
                        let name = HeaderName::try_from(format!("x-filler-{i}")).expect("a name");
                        headers.append(name, HeaderValue::from_static("v"));
                    }
                };
                // Missing.
                let mut headers = HeaderMap::new();
                filler(&mut headers, others);
                assert_eq!(
                    single(&headers, &name),
                    None,
                    "{others} others, {name} missing"
                );
                // Once, at every place among the others.
                for at in 0..=others {
                    let mut headers = HeaderMap::new();
                    filler(&mut headers, at);
                    headers.append(&name, HeaderValue::from_static("one"));
                    let mut rest = HeaderMap::new();
                    filler(&mut rest, others);
                    for (other, value) in rest.iter().skip(at) {
                        headers.append(other, value.clone());
                    }
                    assert_eq!(
                        single(&headers, &name).map(HeaderValue::as_bytes),
                        Some(&b"one"[..]),
                        "{others} others, {name} at {at}"
                    );
                }
                // Twice, apart.
                let mut headers = HeaderMap::new();
                headers.append(&name, HeaderValue::from_static("one"));
                filler(&mut headers, others);
                headers.append(&name, HeaderValue::from_static("two"));
                assert_eq!(
                    single(&headers, &name),
                    None,
                    "{others} others, {name} twice"
                );
            }
        }
    }

    /// Whatever a map went through (values appended, inserted over, removed; few names with
    /// many values, many names), the value found is the one the map's own index finds when
    /// the name has exactly one, and none otherwise: the two lookups agree on either side of
    /// the bound.
    #[test]
    fn a_single_value_agrees_with_the_maps_index() {
        let names = [
            header::CONTENT_TYPE,
            header::CONTENT_LENGTH,
            HeaderName::from_static("idempotency-key"),
            HeaderName::from_static("x-a"),
            HeaderName::from_static("x-b"),
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |below: usize| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            usize::try_from(seed >> 33).expect("31 bits") % below
        };
        let mut seen = [false; 2];
        for _ in 0..2_000 {
            let mut headers = HeaderMap::new();
            for step in 0..next(16) {
                let name = &names[next(names.len())];
                let value = HeaderValue::from(step);
                match next(4) {
                    0 => {
                        headers.insert(name, value);
                    }
                    1 => {
                        headers.remove(name);
                    }
                    _ => {
                        headers.append(name, value);
                    }
                }
            }
            seen[usize::from(headers.len() > SCANNED)] = true;
            for name in &names {
                let mut all = headers.get_all(name).iter();
                let oracle = match (all.next(), all.next()) {
                    (Some(value), None) => Some(value),
                    _ => None,
                };
                assert_eq!(single(&headers, name), oracle, "{name} in {headers:?}");
            }
        }
        assert_eq!(seen, [true, true], "maps on both sides of the bound");
    }

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

    /// The layer's own mark of a compact record is never taken from a create's response,
    /// alone or beside other headers, and is matched whatever its case on the wire.
    #[test]
    fn the_body_omitted_mark_of_a_create_is_dropped() {
        for others in [&[][..], &[("location", "/labels/1")][..]] {
            let mut headers = HeaderMap::new();
            headers.append("Idempotent-Body-Omitted", HeaderValue::from_static("true"));
            for (name, value) in others {
                headers.append(*name, HeaderValue::from_static(value));
            }
            retain_storable(&mut headers, &[]);
            assert!(!headers.contains_key(&BODY_OMITTED), "{others:?}");
            assert_eq!(headers.len(), others.len());
            assert_eq!(BODY_OMITTED, crate::reply::IDEMPOTENT_BODY_OMITTED);
        }
    }
}
