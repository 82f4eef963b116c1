//! Case 3's fenced baselines: the smallest fenced locks one could write by
//! hand, on a raw multiplexed connection as rslock uses, so that ours is
//! read against a fenced lock and not only against rslock's unfenced one.
//! Each hands out a token with the grant and releases by compare-and-delete
//! (rslock's script); none has a queue, a hand-off or a re-send check.

use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use redis::Script;

/// Which fenced lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// One script: the counter's `INCR`, then `SET NX PX` of
    /// "<owner> <token>": the shape of a fenced lock without a clock floor.
    /// A counter that loses increments (a failover, a restart without
    /// persistence) hands out tokens already used.
    Incr,
    /// The same without a script: `MULTI`, `INCR`, `SET NX PX`, `EXEC`.
    /// The value cannot hold the token, so it holds the owner alone.
    Transaction,
    /// Our acquire's commands with nothing checked: `TIME`, the counter's
    /// `SET … GET` (a token floored at the server's clock), `SET NX PX`
    /// (case 11's floor script, without the queue's `HDEL`).
    ClockFloor,
}

impl Kind {
    pub(crate) const ALL: [Kind; 3] = [Kind::Incr, Kind::Transaction, Kind::ClockFloor];

    /// Its own counter: the kinds' tokens differ in length.
    fn counter(self) -> &'static str {
        match self {
            Kind::Incr => "c3:fence:incr",
            Kind::Transaction => "c3:fence:multi",
            Kind::ClockFloor => "c3:fence:clock",
        }
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Kind::Incr => "fenced floor: one script, `INCR` + `SET NX PX` (no clock floor)",
            Kind::Transaction => {
                "fenced floor: `MULTI` `INCR` `SET NX PX` `EXEC`, no script (no clock floor)"
            }
            Kind::ClockFloor => {
                "fenced floor: one script, `TIME` + `SET … GET` + `SET NX PX` (ours, unchecked)"
            }
        }
    }
}

const INCR: &str = "local t = redis.call('incr', KEYS[2])
if redis.call('set', KEYS[1], ARGV[1] .. ' ' .. t, 'NX', 'PX', ARGV[2]) then return {1, t} end
return {0, 0}";

const CLOCK_FLOOR: &str = "local t = redis.call('time')
local us = t[2]
if #us < 6 then us = string.sub('00000' .. us, -6) end
local token = t[1] .. us
local last = redis.call('set', KEYS[2], token, 'PX', '86400000', 'GET')
if last and #last == #token and last >= token then
  token = string.format('%.0f', tonumber(last) + 1)
  redis.call('set', KEYS[2], token, 'PX', '86400000')
end
if redis.call('set', KEYS[1], ARGV[1] .. ' ' .. token, 'NX', 'PX', ARGV[2]) then return {1, token} end
return {0, 0}";

/// rslock's release: delete the lock if it still holds this value.
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
else
  return 0
end";

const LEASE_MS: u64 = 30_000;

/// The connection and the scripts, shared by the tasks.
#[derive(Clone)]
pub(crate) struct Floors {
    conn: MultiplexedConnection,
    scripts: Arc<[Script; 3]>,
}

impl Floors {
    pub(crate) async fn connect(port: u16) -> Floors {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("fenced floors' connection");
        Floors {
            conn,
            scripts: Arc::new([
                Script::new(INCR),
                Script::new(CLOCK_FLOOR),
                Script::new(RELEASE),
            ]),
        }
    }

    /// One lock + unlock of `key` by `owner` (unique), asserting the grant
    /// and its token.
    pub(crate) async fn cycle(&self, kind: Kind, key: &str, owner: &str) {
        let mut conn = self.conn.clone();
        let [incr, clock, release] = &*self.scripts;
        let value = match kind {
            Kind::Transaction => {
                let (token, set): (u64, Option<String>) = redis::pipe()
                    .atomic()
                    .incr(kind.counter(), 1)
                    .cmd("SET")
                    .arg(key)
                    .arg(owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(LEASE_MS)
                    .query_async(&mut conn)
                    .await
                    .expect("fenced floor (transaction) acquire");
                assert!(token > 0 && set.is_some(), "a fresh key was busy");
                owner.to_owned()
            }
            Kind::Incr | Kind::ClockFloor => {
                let script = if kind == Kind::Incr { incr } else { clock };
                let (taken, token): (u8, u64) = script
                    .key(key)
                    .key(kind.counter())
                    .arg(owner)
                    .arg(LEASE_MS)
                    .invoke_async(&mut conn)
                    .await
                    .expect("fenced floor acquire");
                assert!(taken == 1 && token > 0, "a fresh key was busy");
                format!("{owner} {token}")
            }
        };
        let freed: u8 = release
            .key(key)
            .arg(value)
            .invoke_async(&mut conn)
            .await
            .expect("fenced floor release");
        assert_eq!(freed, 1, "the release found its lock gone");
    }
}
