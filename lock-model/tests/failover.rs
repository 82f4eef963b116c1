//! A Sentinel failover that promotes a replica lacking the writes of the
//! current instant, acknowledged ones included (`Faults::failover`).
//!
//! Without `replica_acks` a lock can be lost: what is checked is that its
//! holder learns it at its next renewal (until then it counts as holding
//! nothing), that tokens still rise, and every other property, with what
//! the failover brings back (a released lock, a queue entry) excused until
//! it lapses. With `replica_acks` no lock a holder was told it has is lost,
//! so mutual exclusion holds as it is.

use lock_model::check;
use lock_model::defects::Defects;
use lock_model::properties::{FAILOVER_KEPT, FAILOVER_LOST, HANDED_OVER};
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
