//! Semaphores (`docs/SEMAPHORES.md`): permits taken, queued, handed over,
//! renewed, kept and lapsing, the real permit scripts run, on the code as
//! it is (`Defects::TODAY`), with the faults the lock worlds have. Every
//! property in every state, among them: at most N holders by each
//! request's own N, tokens unique, no permit left behind, a release that
//! frees a permit serves the first waiter that hears it.

use lock_model::check;
use lock_model::defects::Defects;
use lock_model::plan::World;
use lock_model::properties::{HANDED_OVER, PERMITS_FULL};
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
