//! The worlds the tests check: one per known race, aimed at it with the
//! fewest clients and faults that reach it, and the bounded whole.

use crate::decide::Timing;
use crate::defects::Defects;
use crate::world::{ClientPlan, Deployment, Faults, Plan, World, ACKS, MAIN};

fn client(requests: Vec<Plan>) -> ClientPlan {
    ClientPlan {
        requests,
        lingering: vec![],
    }
}

/// Race 1: a waiter's queuing attempt runs, its reply is lost, and the
/// transport sends it again on a slow connection; its client still
/// listens on the lock (another waiter of it left less than `LINGER`
/// ago). The holder hands the lock over, the grant reaches no mailbox, and
/// the orphan timer fires while the re-sent attempt's answer is on its way.
pub fn orphan_inflight(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            ClientPlan {
                requests: vec![Plan::write(0).wait(5000)],
                lingering: vec![0],
            },
            client(vec![Plan::write(0).wait(5000)]),
        ],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            lose_reply: 1,
            slow: Some((1, MAIN)),
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// Race 2: Sentinel with `replica_acks`; a waiter's request is dropped
/// while its attempt is on the acks connection.
pub fn unsure_release_overtakes(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(2000)]),
        ],
        keys: 1,
        deployment: Deployment::SentinelAcks,
        faults: Faults {
            cancel: 1,
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// Race 3: a queuing attempt repeated verbatim by the transport (no rejoin
/// flag) runs after the holder's lease ran out (the holder crashed).
pub fn ghost_queue_entry(defects: Defects) -> World {
    World {
        clients: vec![
            client(vec![Plan::write(0)]),
            client(vec![Plan::write(0).wait(9000)]),
        ],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            resend_verbatim: 1,
            crash: 1,
            slow: Some((1, MAIN)),
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// Race 4: a renewal whose reply is lost is sent again after the holder's
/// `min_hold` release.
pub fn renewal_after_keep(defects: Defects) -> World {
    World {
        clients: vec![client(vec![Plan::write(0).body(1000).min_hold(2500)])],
        keys: 1,
        deployment: Deployment::Redis,
        faults: Faults {
            lose_reply: 1,
            ..Faults::default()
        },
        defects,
        timing: Timing::default(),
    }
}

/// Unused yet: keeps `ACKS` referenced for scenario authors.
pub const _ACKS: u8 = ACKS;
