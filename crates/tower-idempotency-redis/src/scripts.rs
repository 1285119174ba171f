//! The store's Lua scripts, each in a file of its own beside this one, and how they are sent.

use redis::Script;

/// Claim: creates the pending reservation with its lease, or reports conflict (fingerprint
/// first), pending or replay with the stored response, all in one atomic step; takes over a
/// pending record whose lease lapsed when asked to.
pub(super) const CLAIM: &str = include_str!("claim.lua");

/// Renew: a new lease, only while pending under this reservation.
pub(super) const RENEW: &str = include_str!("renew.lua");

/// Complete: only while pending under this reservation.
pub(super) const COMPLETE: &str = include_str!("complete.lua");

/// Release: only while pending under this reservation.
pub(super) const RELEASE: &str = include_str!("release.lua");

/// Settle: release a lost claim's reservation if it took effect, and fence it, so that the
/// claim arriving late writes nothing.
pub(super) const SETTLE: &str = include_str!("settle.lua");

/// Inspect: the fingerprint, whether pending, the stored status, the age in ms (-1 if
/// unknown) and whether its lease lapsed, or nothing.
pub(super) const INSPECT: &str = include_str!("inspect.lua");

/// Resolve: complete a pending record, whoever reserved it.
pub(super) const RESOLVE: &str = include_str!("resolve.lua");

/// The scripts of one store, each with its hash.
pub(super) struct Scripts {
    pub(super) claim: Lua,
    pub(super) renew: Lua,
    pub(super) complete: Lua,
    pub(super) release: Lua,
    pub(super) settle: Lua,
    pub(super) inspect: Lua,
    pub(super) resolve: Lua,
}

/// A script of the store, sent with `EVALSHA`, and with `EVAL` (which caches it) to a server
/// that does not have it yet: after a restart, say. Both go to the one node of the script's
/// key, so a cluster node that is down or hung elsewhere cannot hold it up (`SCRIPT LOAD`
/// would go to every node).
pub(super) struct Lua {
    pub(super) code: &'static str,
    pub(super) hash: String,
}

impl Lua {
    pub(super) fn new(code: &'static str) -> Self {
        Self {
            code,
            hash: Script::new(code).get_hash().to_owned(),
        }
    }
}
