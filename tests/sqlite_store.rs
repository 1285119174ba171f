//! The SQLite store: the conformance suite on one file shared by every store of the run, and
//! what only it offers. Needs nothing installed: the SQLite library is built in.
#![cfg(feature = "sqlite")]

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use tower_idempotency::store::SqliteStore;

/// One file for the whole run, in a fresh temporary directory: every store opened on it is
/// another connection, as another process's would be.
fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!(
            "tower-idempotency-sqlite-{}-{}",
            std::process::id(),
            tower_idempotency::Reservation::generate()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        dir.join("records.sqlite3")
    })
}

async fn make_store(retention: Option<Duration>) -> SqliteStore {
    let store = SqliteStore::open(path()).await.expect("the SQLite file");
    match retention {
        Some(retention) => store.retention(retention),
        None => store,
    }
}

tower_idempotency::store_conformance!(make_store, retention = Duration::from_millis(200));
