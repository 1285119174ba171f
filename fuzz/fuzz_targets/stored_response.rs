//! The stored-response format read from any bytes: never a panic, and whatever reads back
//! is written again to bytes that read back as the same response.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tower_idempotency::store::StoredResponse;

fuzz_target!(|data: &[u8]| {
    if let Ok(response) = StoredResponse::from_bytes(Bytes::copy_from_slice(data)) {
        let again = StoredResponse::from_bytes(response.to_bytes()).expect("its own bytes read back");
        assert_eq!(again, response);
    }
});
