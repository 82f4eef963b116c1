//! Switches that each restore one known defect of the protocol (the four
//! races of delayed and repeated replies, fixed since, and three of issue
//! 30: renewals the replicas never confirmed, a watchdog blinded by a
//! renewal round in flight, and a queued reader nobody hears that blocks
//! the writer behind it), so that a test can show the checker finds it
//! with the switch on and nothing with it off.
//!
//! Client-side defects switch what the runtime's decisions are fed, or the
//! world's plumbing (which connection a command takes, which script a
//! release calls). The two script-side defects run today's `acquire.lua`
//! or `release.lua` with its fix taken out again ([`RACE_3_FIX`],
//! [`DEAD_READER_FIX`]): the scripts' layout has changed since race 3's
//! fix, so a copy of the script from before it could not run beside
//! today's others.

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
    /// Race 3: `acquire.lua` without its fix ([`RACE_3_FIX`]): only the
    /// client's rejoin flag says an earlier send may have queued the owner,
    /// so a queuing attempt repeated by a transport without it can take the
    /// lock and leave its queue entry behind.
    pub acquire_before_fixes: bool,
    /// Race 4: a `min_hold` release through `renew.lua` (a compare-and-
    /// expire, as `guard.rs::keep` did before `keep.lua`): a renewal re-sent
    /// after it restores the full lease.
    pub keep_by_renewal: bool,
    /// Sentinel with `replica_acks`: a renewal books the holder's new
    /// deadline from the primary's answer alone, with no `WAIT` (as
    /// `sentinel.rs::renew` did): a replica that missed the renewals is
    /// promoted with the lock ending before the holder believes. Off: a
    /// renewal moves the deadline only once the replicas acknowledged it
    /// (a `WAIT` behind it on its connection; no acknowledgement is no
    /// answer).
    pub renewal_unacked: bool,
    /// The watchdog runs one round at a time (`watchdog.rs` awaited `tick()`
    /// in its loop): while a round's renewals are out, no other hold of the
    /// client is looked at, and the round waits until the earliest deadline
    /// of its own batch; a hold taken meanwhile can lapse unnoticed. Off:
    /// every hold's deadline is watched on its own (its renewal goes out
    /// when due, whatever is in flight, and is declared lost at its
    /// deadline).
    pub watchdog_one_round: bool,
    /// Issue 30, item 5: `release.lua` without its fix
    /// ([`DEAD_READER_FIX`]): a reader at the head of the queue ends the
    /// scan at the next writer even when nobody heard its grant, so the
    /// release deletes the lock and the writer behind stays queued.
    pub release_before_fixes: bool,
    /// `keep_permit.lua` without its fix ([`KEEP_PERMIT_FIX`]): the
    /// owner's field is deleted before the kept one is written, so keeping
    /// a semaphore's only permit empties the hash (Redis deletes it) and
    /// writes the kept field into a new hash without an expiry.
    pub keep_permit_before_fix: bool,
    /// `release_permit.lua` without its fix ([`GIVE_UP_FIX`]): a waiter
    /// that gives up leaves the queue and serves nobody, though at its
    /// head it held back waiters of a larger N (strict FIFO) that the free
    /// permits admit, and behind it free permits may wait for a waiter.
    pub release_permit_before_fix: bool,
    /// Not a defect the scripts ever had, a canary: `permit.lua` admitting
    /// a request while as many as its N hold ([`ONE_TOO_MANY`]), so that
    /// a test shows the bound on permit holders is checked at all.
    pub permit_admits_one_more: bool,
}

impl Defects {
    /// The code as it is: every known defect fixed. (Issue 30's items 1
    /// and 2 are fixed in the runtime by `sentinel.rs` confirming renewals
    /// with `WAIT` and `watchdog.rs` sending rounds side by side, each hold
    /// declared lost at its own deadline; item 5 in `release.lua`.)
    pub const TODAY: Defects = Defects {
        orphan_ignores_inflight: false,
        undo_on_main: false,
        acquire_before_fixes: false,
        keep_by_renewal: false,
        renewal_unacked: false,
        watchdog_one_round: false,
        release_before_fixes: false,
        keep_permit_before_fix: false,
        release_permit_before_fix: false,
        permit_admits_one_more: false,
    };

    /// The code before the fixes: every known defect present.
    pub const BEFORE_FIXES: Defects = Defects {
        orphan_ignores_inflight: true,
        undo_on_main: true,
        acquire_before_fixes: true,
        keep_by_renewal: true,
        renewal_unacked: true,
        watchdog_one_round: true,
        release_before_fixes: true,
        keep_permit_before_fix: true,
        release_permit_before_fix: true,
        permit_admits_one_more: false,
    };
}

/// Race 3's fix as it stands in `lock-runtime/scripts/acquire.lua`, and the
/// line it replaced: a queuing attempt is checked for an earlier send
/// whatever the client's rejoin flag (`j`) says. The switch puts the old
/// line back; if the fix's line changes, the host says so when it loads the
/// scripts, and this pair must follow.
pub const RACE_3_FIX: (&str, &str) = (
    "local may_be_queued = stay ~= '' or (flags ~= 'f' and string.find(flags, 'j', 1, true) ~= nil)",
    "local may_be_queued = flags ~= 'f' and string.find(flags, 'j', 1, true) ~= nil",
);

/// Issue 30 item 5's fix as it stands in `lock-runtime/scripts/release.lua`,
/// each line with what it replaced: the scan stops at a writer only after
/// a reader that heard (or a read hold being joined), not after any reader
/// it popped. The switch puts the old lines back (a reader popped, heard or
/// not, is `passed`); if a fixed line changes, the host says so when it
/// loads the scripts, and these pairs must follow.
pub const DEAD_READER_FIX: [(&str, &str); 4] = [
    (
        "  local served = false\n",
        "  local served, passed = false, false\n",
    ),
    (
        "next_waiter(joining or served)",
        "next_waiter(joining or served or passed)",
    ),
    (
        "if not (joining or served) then",
        "if not (joining or served or passed) then",
    ),
    (
        "        redis.call('zrem', readers, head)\n",
        "        redis.call('zrem', readers, head)\n        passed = true\n",
    ),
];

/// `keep_permit.lua`'s fix as it stands, with what it replaced: the kept
/// field is written before the owner's is deleted. The switch puts the old
/// order back.
pub const KEEP_PERMIT_FIX: [(&str, &str); 1] = [(
    "if not ends or tonumber(ends) <= now then\n  redis.call('hdel', sem, owner)\n  return 0\nend\n",
    "redis.call('hdel', sem, owner)\nif not ends or tonumber(ends) <= now then\n  return 0\nend\n",
), ];

/// `release_permit.lua`'s fix as it stands, with what it replaced: a waiter
/// that gives up goes on to serve the queue (first only at the head, now
/// from anywhere in it). The switch puts the early return back for every
/// leaver.
pub const GIVE_UP_FIX: [(&str, &str); 1] = [(
    "  redis.call('lrem', queue, 1, owner)\nend\n",
    "  redis.call('lrem', queue, 1, owner)\n  return 0\nend\n",
)];

/// `permit.lua`'s admission, and the canary's (`Defects::permit_admits_one_more`).
pub const ONE_TOO_MANY: [(&str, &str); 1] = [(
    "if live < permits and not blocked then",
    "if live <= permits and not blocked then",
)];
