//! Headers that must not be replayed are never stored.

use crate::common;

use common::*;
use http::header::SET_COOKIE;

#[tokio::test]
async fn hop_by_hop_and_excluded_headers_are_neither_stored_nor_replayed() {
    let rig = Rig::build(
        Journal::default(),
        Default::default(),
        Inner::new(tower::service_fn(|_| async {
            let mut response = created_response();
            let headers = response.headers_mut();
            headers.insert("connection", "keep-alive, x-hop".parse().unwrap());
            headers.insert("keep-alive", "timeout=5".parse().unwrap());
            headers.insert("x-hop", "1".parse().unwrap());
            headers.insert("transfer-encoding", "chunked".parse().unwrap());
            headers.insert(SET_COOKIE, "session=abc".parse().unwrap());
            Ok::<_, CreateError>(response)
        })),
        |layer| layer.exclude_headers([SET_COOKIE]),
    );
    let first = rig.send(valid()).await;
    first.is_created(); // exactly the four stored headers
    let stored = rig.memory.completed(&key_of(KEY)).unwrap();
    for name in [
        "connection",
        "keep-alive",
        "x-hop",
        "transfer-encoding",
        "set-cookie",
    ] {
        assert!(!stored.headers().contains_key(name), "{name} stored");
    }
    let replay = rig.send(valid()).await;
    replay.is_created();
    assert_eq!(
        replay.headers, first.headers,
        "the first answer and the replay agree"
    );
}
