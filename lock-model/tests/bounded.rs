//! The properties over the whole bounded space (the bounds are in the
//! crate's README), on the code as it is (`Defects::TODAY`): every fault
//! the world knows, in some world.

use lock_model::check;
use lock_model::defects::Defects;
use lock_model::properties::HANDED_OVER;
use lock_model::scenarios;

const D: Defects = Defects::TODAY;

fn clean(name: &str, world: lock_model::plan::World) {
    let r = check::run(name, world, None);
    r.assert_clean();
    r.assert_reached(HANDED_OVER);
}

#[test]
fn three_clients_two_keys_one_crash() {
    clean("3 clients, 2 keys, a crash", scenarios::two_keys_crash(D));
}

#[test]
fn three_clients_two_keys_one_cancel() {
    clean("3 clients, 2 keys, a cancel", scenarios::two_keys_cancel(D));
}

#[test]
fn three_clients_one_key_a_lost_reply_and_a_cancel() {
    clean(
        "3 clients, 1 key, a lost reply, a cancel",
        scenarios::one_key_lost_reply_cancel(D),
    );
}

#[test]
fn three_clients_one_key_a_verbatim_resend_on_a_slow_connection() {
    clean(
        "3 clients, 1 key, a verbatim re-send, a slow connection",
        scenarios::one_key_resend_slow(D),
    );
}

#[test]
fn min_hold_and_max_hold_with_a_lost_reply_and_a_cancel() {
    clean(
        "min_hold and max_hold, a lost reply, a cancel",
        scenarios::hold_bounds(D),
    );
}

#[test]
fn sentinel_with_acks_a_lost_reply_and_a_cancel() {
    clean(
        "Sentinel with acks, a lost reply, a cancel",
        scenarios::sentinel_acks(D),
    );
}
