//! How the runtime calls the scripts (`lock-runtime/src/backend/node.rs`):
//! the KEYS and ARGV of every call the model's server makes, in one place.
//! A script whose arguments change changes here, and only here; the copies
//! kept to restore a defect (`scripts-before-fixes/`) get the arguments
//! they took then.

use crate::host::Script;

/// One script call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub script: Script,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// `lock:{k<k>}` and its other names, as `key.rs` makes them: the lock,
/// its fence counter, queue, waiters and readers.
pub fn names(k: u8) -> [String; 5] {
    let h = format!("lock:{{k{k}}}");
    [
        h.clone(),
        format!("{h}:fence"),
        format!("{h}:queue"),
        format!("{h}:waiters"),
        format!("{h}:readers"),
    ]
}

/// The grant channel of client `c` on lock `k` (`LockName::grants` + the
/// client id).
pub fn grant_channel(k: u8, c: u8) -> String {
    format!("{}:granted:c{c}", names(k)[0])
}

/// The owner id split after its first `:` (`node.rs::owner_parts`).
fn owner_parts(owner: &str) -> (String, String) {
    let (front, rest) = owner.split_at(owner.find(':').map_or(0, |i| i + 1));
    (front.to_string(), rest.to_string())
}

/// `RedisNode::acquire` on one server (no Redlock floor): `stay` in ms if
/// the attempt queues when busy, `rejoin` if an earlier send may have
/// queued it. `before_fixes`: the copy from before the fixes, which takes
/// the same arguments.
pub fn acquire(
    k: u8,
    owner: &str,
    lease: u64,
    (stay, rejoin): (Option<u64>, bool),
    before_fixes: bool,
) -> Call {
    Call {
        script: if before_fixes {
            Script::AcquireBeforeFixes
        } else {
            Script::Acquire
        },
        keys: names(k).to_vec(),
        args: vec![
            owner.to_string(),
            lease.to_string(),
            String::new(),
            stay.map_or(String::new(), |s| s.to_string()),
            if rejoin { "1".into() } else { String::new() },
        ],
    }
}

/// `RedisNode::release` on one server (`Wake::IfReleased`, `PUBLISH`), not
/// forced.
pub fn release(k: u8, owner: &str) -> Call {
    let h = &names(k)[0];
    Call {
        script: Script::Release,
        keys: names(k).to_vec(),
        args: vec![
            owner.to_string(),
            format!("{h}:granted:"),
            "publish".into(),
            format!("{h}:released"),
            "r".into(),
            String::new(),
        ],
    }
}

/// `RedisNode::renew_one`: a writer's through `renew.lua`, a reader's
/// through `renew_read.lua`. `before_fixes`: the copy of `renew.lua` that
/// a `min_hold` release went through before `keep.lua`.
pub fn renew(k: u8, owner: &str, read: bool, lease: u64, before_fixes: bool) -> Call {
    let n = names(k);
    let (front, rest) = owner_parts(owner);
    let args = vec![lease.to_string(), front, rest];
    let (script, keys) = match (read, before_fixes) {
        (true, _) => (Script::RenewRead, vec![n[0].clone(), n[4].clone()]),
        (false, false) => (Script::Renew, vec![n[0].clone()]),
        (false, true) => (Script::RenewBeforeFixes, vec![n[0].clone()]),
    };
    Call { script, keys, args }
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
    let one = |args: [&str; 3]| Call {
        script: Script::Command,
        keys: vec![],
        args: args
            .iter()
            .filter(|a| !a.is_empty())
            .map(|a| a.to_string())
            .collect(),
    };
    [
        one(["HEXISTS", &n[3], owner]),
        one(["GET", &n[0], ""]),
        one(["ZSCORE", &n[4], owner]),
    ]
}
