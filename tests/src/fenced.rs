//! A fenced store: the resource side of Kleppmann's fencing argument.
//!
//! A lock alone cannot stop a holder that was paused (GC, swap, SIGSTOP, a
//! stopped VM) past its lease from writing after someone else took the lock.
//! The resource has to help: every write carries the lock's fencing token
//! ([`LockGuard::fence`](lock_runtime::LockGuard::fence) or
//! [`current_fence`](lock_runtime::current_fence)), and the resource
//! rejects a write whose token is lower than the highest it has accepted.
//!
//! [`FencedStore`] is that check for a value kept in Redis, done atomically
//! by one Lua script. It is written to be copied into an application (it
//! needs only the `redis` crate); `docs/FENCING.md` explains the pattern.
//!
//! ```no_run
//! # async fn demo(client: lock_runtime::LockClient) -> Result<(), Box<dyn std::error::Error>> {
//! use tests::fenced::{FencedStore, Write};
//! let store = FencedStore::connect("redis://127.0.0.1:6379").await?;
//! let guard = client.lock("order:42").await?;
//! match store.write("order:42", guard.fence(), "paid").await? {
//!     Write::Accepted => {}
//!     // Someone with a newer token wrote already: our lock ran out.
//!     Write::Rejected { highest } => eprintln!("stale write: token {} < {highest}", guard.fence()),
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use redis::aio::ConnectionManager;

/// The check and the write in one atomic step.
///
/// `KEYS[1]`: the stored record, a hash `{fence, value}`.
/// `ARGV[1]`: the writer's fencing token; `ARGV[2]`: the value.
/// Returns `{1, token}` accepted, `{0, highest}` rejected.
///
/// A token equal to the highest is accepted: the same holder may write
/// several times under one lock. Tokens compare as Lua numbers, exact up to
/// 2^53 — more acquisitions than any key will see.
pub const FENCED_WRITE_LUA: &str = r#"
local highest = tonumber(redis.call('hget', KEYS[1], 'fence') or '0')
local fence = tonumber(ARGV[1])
if fence == nil then
  return redis.error_reply('fenced write: the token is not a number')
end
if fence < highest then
  return {0, highest}
end
redis.call('hset', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return {1, fence}
"#;

/// What the store did with a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Stored: the token was the highest seen (or equal to it).
    Accepted,
    /// Refused: a write with token `highest` was accepted before, so the
    /// writer's lock is no longer the newest one.
    Rejected { highest: u64 },
}

/// A value per key in Redis that only the newest lock holder can change.
#[derive(Clone)]
pub struct FencedStore {
    conn: ConnectionManager,
    script: redis::Script,
    prefix: String,
}

impl FencedStore {
    /// Connect; records live under `fenced:<key>`.
    pub async fn connect(url: &str) -> redis::RedisResult<Self> {
        Self::connect_with_prefix(url, "fenced:").await
    }

    /// Connect; records live under `<prefix><key>`.
    pub async fn connect_with_prefix(url: &str, prefix: &str) -> redis::RedisResult<Self> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)));
        let conn = ConnectionManager::new_with_config(redis::Client::open(url)?, config).await?;
        Ok(FencedStore {
            conn,
            script: redis::Script::new(FENCED_WRITE_LUA),
            prefix: prefix.to_owned(),
        })
    }

    /// Write `value` to `key` if `fence` is not lower than the highest token
    /// the key has accepted.
    pub async fn write(&self, key: &str, fence: u64, value: &str) -> redis::RedisResult<Write> {
        let mut conn = self.conn.clone();
        let (ok, n): (i64, u64) = self
            .script
            .key(format!("{}{key}", self.prefix))
            .arg(fence)
            .arg(value)
            .invoke_async(&mut conn)
            .await?;
        Ok(if ok == 1 {
            Write::Accepted
        } else {
            Write::Rejected { highest: n }
        })
    }

    /// The accepted record: (token, value), or `None` if never written.
    pub async fn read(&self, key: &str) -> redis::RedisResult<Option<(u64, String)>> {
        let mut conn = self.conn.clone();
        let (fence, value): (Option<u64>, Option<String>) = redis::cmd("HMGET")
            .arg(format!("{}{key}", self.prefix))
            .arg("fence")
            .arg("value")
            .query_async(&mut conn)
            .await?;
        Ok(fence.zip(value))
    }
}
