//! How the runtime calls the scripts (`lock-runtime/src/backend/node.rs`,
//! one Redis server): the KEYS and ARGV of every call the model's server
//! makes, in one place. A script whose arguments or keys change changes
//! here, and only here.

use crate::host::Script;

/// The key prefix (`Config::prefix`).
const PREFIX: &str = "lock:";

/// One script call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub script: Script,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// The names of lock `k`, as `key.rs` makes them: the lock (or the
/// semaphore's hash), the token counter (one per server:
/// `LockName::counter(false)`), the queue, the waiters and the readers.
pub fn names(k: u8) -> [String; 5] {
    let h = format!("{PREFIX}{{k{k}}}");
    [
        h.clone(),
        format!("{PREFIX}fence"),
        format!("{h}:queue"),
        format!("{h}:waiters"),
        format!("{h}:readers"),
    ]
}

/// The grant channel of client `c` on lock `k` (`LockName::grant_channel`).
pub fn grant_channel(k: u8, c: u8) -> String {
    format!("{}:granted:c{c}", names(k)[0])
}

/// The owner id split after its first `:` (`node.rs::owner_parts`).
fn owner_parts(owner: &str) -> (String, String) {
    let (front, rest) = owner.split_at(owner.find(':').map_or(0, |i| i + 1));
    (front.to_string(), rest.to_string())
}

/// `RedisNode::acquire` on one server, fenced (no Redlock floor): `stay`
/// in ms if the attempt queues when busy, `rejoin` if an earlier send may
/// have queued it (`j`), `fence_ttl` in ms. `before_fixes`: race 3's
/// switch (`Defects::acquire_before_fixes`).
pub fn acquire(
    k: u8,
    owner: &str,
    lease: u64,
    (stay, rejoin): (Option<u64>, bool),
    fence_ttl: u64,
    before_fixes: bool,
) -> Call {
    let n = names(k);
    Call {
        script: if before_fixes {
            Script::AcquireBeforeFixes
        } else {
            Script::Acquire
        },
        keys: vec![n[0].clone(), n[1].clone()],
        args: trailing_defaults_left_out(
            vec![
                owner.to_string(),
                lease.to_string(),
                stay.map_or(String::new(), |s| s.to_string()),
                if rejoin { "fj" } else { "f" }.to_string(),
                fence_ttl.to_string(),
            ],
            2,
            &["", "f", DEFAULT_FENCE_TTL],
        ),
    }
}

/// The default `fence_ttl` (24 h) in ms, which the scripts assume when it
/// is left out.
const DEFAULT_FENCE_TTL: &str = "86400000";

/// `args` less its trailing arguments that equal their defaults
/// (`defaults`: of the arguments from `args[first]` on), as `node.rs`
/// leaves them out.
fn trailing_defaults_left_out(
    mut args: Vec<String>,
    first: usize,
    defaults: &[&str],
) -> Vec<String> {
    while args.len() > first
        && args.last().map(String::as_str) == Some(defaults[args.len() - 1 - first])
    {
        args.pop();
    }
    args
}

/// `RedisNode::release` on one server (`Wake::IfReleased`, `PUBLISH`, not
/// forced): `fence` the hold's token for a writer's guard, whose release
/// sends the hold's value (`release_writer`), else 0 (the owner id). The
/// counter is left out of the keys (the prefix has no `{`), and the flags
/// and `fence_ttl` at their defaults. `before_fixes`: item 5's switch
/// (`Defects::release_before_fixes`).
pub fn release(k: u8, owner: &str, fence: u64, fence_ttl: u64, before_fixes: bool) -> Call {
    let n = names(k);
    let held = if fence == 0 {
        owner.to_string()
    } else {
        format!("{owner} {fence}")
    };
    Call {
        script: if before_fixes {
            Script::ReleaseBeforeFixes
        } else {
            Script::Release
        },
        keys: vec![n[0].clone()],
        args: trailing_defaults_left_out(
            vec![held, "r".into(), fence_ttl.to_string()],
            1,
            &["r", DEFAULT_FENCE_TTL],
        ),
    }
}

/// `RedisNode::renew_one`: a writer's through `renew.lua`, a reader's
/// through `renew_read.lua`, a permit's through `renew_permits.lua`.
pub fn renew(k: u8, owner: &str, read: bool, lease: u64) -> Call {
    let n = names(k);
    let (front, rest) = owner_parts(owner);
    let permit = rest.starts_with('s');
    let args = vec![lease.to_string(), front, rest];
    let (script, keys) = if permit {
        (Script::RenewPermits, vec![n[0].clone()])
    } else if read {
        (Script::RenewRead, vec![n[0].clone(), n[4].clone()])
    } else {
        (Script::Renew, vec![n[0].clone()])
    };
    Call { script, keys, args }
}

/// `RedisNode::acquire_permit` on one server, fenced: `stay` in ms if the
/// attempt queues when busy. (No rejoin flag: `permit.lua` finds an
/// earlier send's queue entry itself.) `one_too_many`: the canary
/// `Defects::permit_admits_one_more`.
pub fn permit(
    k: u8,
    owner: &str,
    lease: u64,
    stay: Option<u64>,
    fence_ttl: u64,
    one_too_many: bool,
) -> Call {
    let n = names(k);
    Call {
        script: if one_too_many {
            Script::PermitOneTooMany
        } else {
            Script::Permit
        },
        keys: vec![n[0].clone(), n[1].clone()],
        args: trailing_defaults_left_out(
            vec![
                owner.to_string(),
                lease.to_string(),
                stay.map_or(String::new(), |s| s.to_string()),
                "f".to_string(),
                fence_ttl.to_string(),
            ],
            2,
            &["", "f", DEFAULT_FENCE_TTL],
        ),
    }
}

/// `RedisNode::run_release_permit` on one server (`Wake::IfReleased`, not
/// forced: no flags): the counter left out of the keys (the prefix has no
/// `{`), the flags and `fence_ttl` at their defaults left out. `before_fix`:
/// `Defects::release_permit_before_fix`.
pub fn release_permit(k: u8, owner: &str, fence_ttl: u64, before_fix: bool) -> Call {
    let n = names(k);
    Call {
        script: if before_fix {
            Script::ReleasePermitBeforeFix
        } else {
            Script::ReleasePermit
        },
        keys: vec![n[0].clone()],
        args: trailing_defaults_left_out(
            vec![owner.to_string(), String::new(), fence_ttl.to_string()],
            1,
            &["", DEFAULT_FENCE_TTL],
        ),
    }
}

/// `RedisNode::keep_permit`: a permit's release with `left` ms of
/// `min_hold`. `before_fix`: `Defects::keep_permit_before_fix`.
pub fn keep_permit(k: u8, owner: &str, left: u64, before_fix: bool) -> Call {
    Call {
        script: if before_fix {
            Script::KeepPermitBeforeFix
        } else {
            Script::KeepPermit
        },
        keys: vec![names(k)[0].clone()],
        args: vec![owner.to_string(), left.to_string()],
    }
}

/// `RedisNode::still_queued_permit`: its pipeline (`HEXISTS` of the
/// waiters, `HEXISTS` of the semaphore).
pub fn still_queued_permit(k: u8, owner: &str) -> [Call; 2] {
    let n = names(k);
    let one = |args: &[&str]| Call {
        script: Script::Command,
        keys: vec![],
        args: args.iter().map(|a| a.to_string()).collect(),
    };
    [
        one(&["HEXISTS", &n[3], owner]),
        one(&["HEXISTS", &n[0], owner]),
    ]
}

/// `RedisNode::keep`: the release of a hold with `left` ms of `min_hold`.
pub fn keep(k: u8, owner: &str, left: u64) -> Call {
    let n = names(k);
    Call {
        script: Script::Keep,
        keys: vec![n[0].clone(), n[4].clone()],
        args: vec![owner.to_string(), left.to_string()],
    }
}

/// `RedisNode::still_queued`: its pipeline, one command each (`HEXISTS`,
/// `GET`, `ZSCORE`).
pub fn still_queued(k: u8, owner: &str) -> [Call; 3] {
    let n = names(k);
    let one = |args: &[&str]| Call {
        script: Script::Command,
        keys: vec![],
        args: args.iter().map(|a| a.to_string()).collect(),
    };
    [
        one(&["HEXISTS", &n[3], owner]),
        one(&["GET", &n[0]]),
        one(&["ZSCORE", &n[4], owner]),
    ]
}
