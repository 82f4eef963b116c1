//! Semaphores (`docs/SEMAPHORES.md`): permits taken, queued, handed over,
//! renewed, kept and lapsing, the real permit scripts run, on the code as
//! it is (`Defects::TODAY`), with the faults the lock worlds have. Every
//! property in every state, among them: at most N holders by each
//! request's own N, tokens unique, no permit left behind, a release that
//! frees a permit serves the first waiter that hears it.

use lock_model::check;
use lock_model::defects::Defects;
use lock_model::plan::World;
use lock_model::properties::{
    FAILOVER_KEPT, FAILOVER_LOST, HANDED_OVER, PERMITS_BOUNDED, PERMITS_FULL, PERMITS_SERVED, TTLS,
};
use lock_model::scenarios;

const D: Defects = Defects::TODAY;

fn clean(name: &str, world: World) {
    let r = check::run(name, world, None);
    r.assert_clean();
    r.assert_reached(PERMITS_FULL);
    r.assert_reached(HANDED_OVER);
}

/// Clean, with as many holders as a request admits; no hand-off needed.
fn clean_full(name: &str, world: World) {
    let r = check::run(name, world, None);
    r.assert_clean();
    r.assert_reached(PERMITS_FULL);
}

#[test]
fn two_permits_three_clients_a_lost_reply_and_a_cancel() {
    clean(
        "2 permits, 3 clients, a lost reply, a cancel",
        scenarios::permits_lost_reply_cancel(D),
    );
}

#[test]
fn two_permits_three_clients_a_crash() {
    clean("2 permits, 3 clients, a crash", scenarios::permits_crash(D));
}

#[test]
fn two_permits_a_verbatim_resend_on_a_slow_connection() {
    clean(
        "2 permits, 3 clients, a verbatim re-send, a slow connection",
        scenarios::permits_resend_slow(D),
    );
}

#[test]
fn clients_that_disagree_on_n_a_lost_reply_and_a_cancel() {
    clean(
        "N = 2 and N = 1 on one key, a lost reply, a cancel",
        scenarios::permits_disagree(D),
    );
}

#[test]
fn permits_with_min_hold_and_max_hold_and_a_lost_reply() {
    clean_full(
        "permits with min_hold and max_hold, a lost reply",
        scenarios::permits_hold_bounds(D),
    );
}

#[test]
fn permits_on_sentinel_with_acks_a_lost_reply_and_a_cancel() {
    clean(
        "2 permits on Sentinel with acks, a lost reply, a cancel",
        scenarios::permits_sentinel_acks(D),
    );
}

/// With the switch on: a counterexample of `property`, printed.
fn found(name: &str, world: World, property: &'static str) -> String {
    let r = check::run(name, world, Some(property));
    let t = r.trace(property).to_string();
    println!("== {}: {property}\n{t}", r.name);
    t
}

/// `keep_permit.lua` deleted the owner's field before writing the kept
/// one: a semaphore's only permit kept for `min_hold` emptied the hash,
/// and the kept field went into a new one without an expiry. (Off: the
/// `min_hold` world above, clean.)
#[test]
fn keeping_the_only_permit_keeps_the_semaphores_expiry() {
    let on = Defects {
        keep_permit_before_fix: true,
        ..D
    };
    let t = found(
        "keep_permit.lua before its fix",
        scenarios::permits_hold_bounds(on),
        TTLS,
    );
    assert!(t.contains("Keep") && t.contains("!"), "{t}");
}

/// `release_permit.lua` let a waiter that gives up leave the queue and
/// serve nobody: the waiter of N = 2 that the one of N = 1 at the head
/// held back stayed queued, listening, beside a free permit. (Off: the
/// world of clients disagreeing on N above, clean.)
#[test]
fn a_waiter_leaving_the_head_serves_those_it_held_back() {
    let on = Defects {
        release_permit_before_fix: true,
        ..D
    };
    let t = found(
        "release_permit.lua before its fix",
        scenarios::permits_disagree(on),
        PERMITS_SERVED,
    );
    assert!(t.contains("unserved") && t.contains("c2:s2"), "{t}");
}

/// A failover to a replica that lacks the writes of the current instant:
/// without `replica_acks` a permit can be lost, and its holder learns it at
/// its next renewal; with them every permit a holder has survives.
#[test]
fn permits_across_a_failover_with_and_without_acks() {
    for acks in [false, true] {
        let name = format!("2 permits, a failover, replica_acks {acks}");
        let r = check::run(&name, scenarios::permits_failover(D, acks), None);
        r.assert_clean();
        r.assert_reached(PERMITS_FULL);
        r.assert_reached(FAILOVER_KEPT);
        if !acks {
            r.assert_reached(FAILOVER_LOST);
        }
    }
}

/// The canary: a `permit.lua` that admits a request while its N hold is
/// caught, with a third holder of two permits.
#[test]
fn a_permit_script_admitting_one_too_many_is_caught() {
    let on = Defects {
        permit_admits_one_more: true,
        ..D
    };
    let t = found(
        "permit.lua admitting one too many",
        scenarios::permits_crash(on),
        PERMITS_BOUNDED,
    );
    assert!(t.contains("2 holders granted before it, 2 allowed"), "{t}");
}
