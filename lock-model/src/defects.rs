//! Switches that each restore one known defect of the protocol (the four
//! races of the safety review), so that a test can show the checker finds
//! it with the switch on and nothing with it off.
//!
//! Client-side defects switch a decision in `decide.rs` or the world's
//! plumbing; script-side ones run the copy of the script as it was before
//! the fix (`scripts-before-fixes/`), so they keep working once the real
//! scripts change.

/// Which old behaviours the model restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Defects {
    /// Race 1: the orphan timer releases an unclaimed grant although its
    /// owner's request is still alive (a re-sent attempt in flight).
    /// Off: an owner whose request is alive is never an orphan.
    pub orphan_ignores_inflight: bool,
    /// Race 2: Sentinel with `replica_acks`: the release that takes back an
    /// unsure attempt goes on the main connection, while the attempt went
    /// on the acks connection, and can run before it. Off: it follows the
    /// attempt on the acks connection.
    pub unsure_release_on_main: bool,
    /// Race 3: `acquire.lua` as before the fix: a queuing attempt repeated
    /// by the transport without the rejoin flag can leave a queue entry
    /// behind.
    pub acquire_before_fixes: bool,
    /// Race 4: `renew.lua` as before the fix: a renewal re-sent after a
    /// `min_hold` release restores the full lease.
    pub renew_before_fixes: bool,
}

impl Defects {
    /// The code as it is today: every known defect present.
    pub const TODAY: Defects = Defects {
        orphan_ignores_inflight: true,
        unsure_release_on_main: true,
        acquire_before_fixes: true,
        renew_before_fixes: true,
    };

    /// Every switch off: the model's fixes for the client-side races, and
    /// the scripts as they are in `lock-runtime/scripts/`.
    pub const NONE: Defects = Defects {
        orphan_ignores_inflight: false,
        unsure_release_on_main: false,
        acquire_before_fixes: false,
        renew_before_fixes: false,
    };
}
