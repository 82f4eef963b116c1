//! The lock scripts run by hand, with the arguments the runtime sends: what
//! a client does, step by step, for tests that build a state on purpose.
//! One place for the scripts' argument lists.

/// How long the runtime keeps a token counter by default (ms).
pub const COUNTER_TTL_MS: u64 = 24 * 3600 * 1000;

/// The token counter of every lock on a single server with the default
/// prefix (`lock:`).
pub const COUNTER: &str = "lock:fence";

/// `acquire.lua` on `lock` (`lock:{key}`) for `owner`: `stay` '' (try once),
/// `'<ms>'` (queue that long) or `'w<ms>'` (Redlock mark); `flags` 'f' for a
/// token, 'j' if an earlier send may have queued. The reply as numbers.
pub fn acquire(
    conn: &mut redis::Connection,
    lock: &str,
    owner: &str,
    lease_ms: u64,
    stay: &str,
    flags: &str,
) -> Vec<i64> {
    redis::Script::new(include_str!("../../lock-runtime/scripts/acquire.lua"))
        .key(lock)
        .key(COUNTER)
        .arg(owner)
        .arg(lease_ms)
        .arg(stay)
        .arg(flags)
        .arg(COUNTER_TTL_MS)
        .invoke(conn)
        .expect("acquire.lua")
}

/// `release.lua` on `lock` as `owner`, with `flags` ('s' SPUBLISH, 'r'/'a'/'n'
/// Redlock wake-ups, 'f' forced): 1 released, 0 absent, -1 another's.
pub fn release(conn: &mut redis::Connection, lock: &str, owner: &str, flags: &str) -> i64 {
    redis::Script::new(include_str!("../../lock-runtime/scripts/release.lua"))
        .key(lock)
        .key(COUNTER)
        .arg(owner)
        .arg(flags)
        .arg(COUNTER_TTL_MS)
        .invoke(conn)
        .expect("release.lua")
}
