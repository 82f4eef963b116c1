//! Switches that each restore one known defect of the protocol (the four
//! races of delayed and repeated replies, fixed since), so that a test can
//! show the checker finds it with the switch on and nothing with it off.
//!
//! Client-side defects switch what the runtime's decisions are fed, or the
//! world's plumbing (which connection a command takes); script-side ones
//! run the copy of the script as it was before the fix
//! (`scripts-before-fixes/`), with the arguments it took then (`calls.rs`).

/// Which old behaviours the model restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Defects {
    /// Race 1: a grant belongs to its request only while the request is
    /// registered as a waiter, not from before its first send: a grant that
    /// arrives while a re-sent attempt is in flight is released as an
    /// orphan. (The runtime routes by `claims.rs`'s live requests; this
    /// feeds `protocol::route` the old answer.)
    pub orphan_ignores_inflight: bool,
    /// Race 2: Sentinel with `replica_acks`: the undo of an unsure attempt
    /// goes on the main connection, while the attempt went on the acks
    /// connection, and can run before it. (The runtime's `Backend::undo`
    /// follows the attempt.)
    pub undo_on_main: bool,
    /// Race 3: `acquire.lua` from before the fix: a queuing attempt repeated
    /// by a transport without the rejoin flag can leave a queue entry
    /// behind.
    pub acquire_before_fixes: bool,
    /// Race 4: a `min_hold` release through `renew.lua` (a compare-and-
    /// expire) instead of `keep.lua`: a renewal re-sent after it restores
    /// the full lease.
    pub keep_by_renewal: bool,
}

impl Defects {
    /// The code as it is: every known defect fixed.
    pub const TODAY: Defects = Defects {
        orphan_ignores_inflight: false,
        undo_on_main: false,
        acquire_before_fixes: false,
        keep_by_renewal: false,
    };

    /// The code before the fixes: every known defect present.
    pub const BEFORE_FIXES: Defects = Defects {
        orphan_ignores_inflight: true,
        undo_on_main: true,
        acquire_before_fixes: true,
        keep_by_renewal: true,
    };
}
