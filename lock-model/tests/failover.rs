//! A Sentinel failover that promotes a replica lacking the writes of the
//! current instant, acknowledged ones included (`Faults::failover`).
//!
//! Without `replica_acks` a lock can be lost: what is checked is that its
//! holder learns it at its next renewal (until then it counts as holding
//! nothing), that tokens still rise, and every other property, with what
//! the failover brings back (a released lock, a queue entry) excused until
//! it lapses. With `replica_acks` no lock a holder was told it has is lost,
//! so mutual exclusion holds as it is, also when replication stalled for
//! longer than a lease before the failover (issue 30, item 1), as long as
//! a renewal moves a holder's deadline only once the replicas have it.

use lock_model::check;
use lock_model::defects::Defects;
use lock_model::properties::{
    ACKED_SURVIVES, FAILOVER_KEPT, FAILOVER_LOST, HANDED_OVER, MUTUAL_EXCLUSION,
};
use lock_model::scenarios;

#[test]
fn a_failover_without_replica_acks_loses_locks_and_their_holders_learn_it() {
    let r = check::run(
        "failover without replica_acks",
        scenarios::failover(Defects::TODAY, false),
        None,
    );
    r.assert_clean();
    r.assert_reached(FAILOVER_LOST);
    r.assert_reached(HANDED_OVER);
}

#[test]
fn a_failover_with_replica_acks_keeps_every_held_lock() {
    let r = check::run(
        "failover with replica_acks",
        scenarios::failover(Defects::TODAY, true),
        None,
    );
    r.assert_clean();
    r.assert_reached(FAILOVER_KEPT);
    assert!(!r.has(FAILOVER_LOST), "a held lock was lost with acks");
}

/// Issue 30, item 1: replication to the replica stalls (renewals included)
/// and the lagging replica is promoted. With renewals booked from the
/// primary's answer alone (the switch on), the holder believes in a
/// deadline the promoted replica never had: the lock is gone from it, or
/// lapses there and another client takes it while the holder still runs.
/// With renewals confirmed by a `WAIT` (off), the holder's deadline is
/// never later than the replica's, and the same world is clean.
#[test]
fn a_failover_to_a_replica_that_missed_the_renewals_leaves_no_holder_unaware() {
    let on = Defects {
        renewal_unacked: true,
        ..Defects::TODAY
    };
    let r = check::run(
        "lagging replica, renewals not confirmed",
        scenarios::lagging_replica(on),
        Some(ACKED_SURVIVES),
    );
    let bad = r.violations();
    let Some(&p) = bad
        .iter()
        .find(|p| [ACKED_SURVIVES, MUTUAL_EXCLUSION].contains(p))
    else {
        panic!("{}: no lock lost to the lagging replica: {bad:?}", r.name);
    };
    let t = r.trace(p);
    println!("== {}: {p}\n{t}", r.name);
    assert!(
        t.contains("Stall") && t.contains("Failover") && t.contains("Renew"),
        "{t}"
    );
    let r = check::run(
        "lagging replica, renewals confirmed",
        scenarios::lagging_replica(Defects::TODAY),
        None,
    );
    r.assert_clean();
    r.assert_reached(FAILOVER_KEPT);
}
