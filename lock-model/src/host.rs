//! A Redis-like Lua 5.1 host for the project's real scripts.
//!
//! One VM per thread, the scripts compiled once; each call moves the
//! keyspace in, runs the script with `KEYS`/`ARGV` set, and moves it back.
//! `redis.call`/`redis.pcall` go to [`Keyspace::command`]; replies cross
//! the boundary as Redis converts them (integers to Lua numbers, nil to
//! `false`, errors to `{err = ...}` tables; back: numbers truncated to
//! integers, `false` to nil, tables to arrays, `{err}`/`{ok}` to
//! error/status replies). Numbers passed as command arguments are written
//! as Redis 7.0 writes them (`%.17g`), and Lua's own `..` keeps `%.14g`:
//! the reason the scripts keep 16-digit tokens as strings.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;

use mlua::{Function, Lua, MultiValue, Table, Value};

use crate::defects::{DEAD_READER_FIX, GIVE_UP_FIX, KEEP_PERMIT_FIX, ONE_TOO_MANY, RACE_3_FIX};
use crate::keyspace::{fmt_g17, Keyspace, Reply};

/// A script the host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Script {
    Acquire,
    Release,
    Renew,
    RenewRead,
    /// The release of a hold with `min_hold` left.
    Keep,
    RaiseFence,
    /// A permit of a semaphore (`docs/SEMAPHORES.md`).
    Permit,
    ReleasePermit,
    RenewPermits,
    KeepPermit,
    InspectPermits,
    RaisePermitFence,
    /// `return redis.pcall(unpack(ARGV))`: one plain command, for tests
    /// and for the commands the runtime sends outside scripts.
    Command,
    /// Today's `acquire.lua` with race 3's fix taken out
    /// (`defects::RACE_3_FIX`), to restore the defect.
    AcquireBeforeFixes,
    /// Today's `release.lua` with issue 30 item 5's fix taken out
    /// (`defects::DEAD_READER_FIX`).
    ReleaseBeforeFixes,
    /// Today's `keep_permit.lua` with its fix taken out
    /// (`defects::KEEP_PERMIT_FIX`).
    KeepPermitBeforeFix,
    /// Today's `release_permit.lua` with its fix taken out
    /// (`defects::GIVE_UP_FIX`).
    ReleasePermitBeforeFix,
    /// `permit.lua` admitting one holder too many (`defects::ONE_TOO_MANY`).
    PermitOneTooMany,
}

const SOURCES: [(Script, &str, &str); 13] = [
    (
        Script::Acquire,
        "acquire.lua",
        include_str!("../../lock-runtime/scripts/acquire.lua"),
    ),
    (
        Script::Release,
        "release.lua",
        include_str!("../../lock-runtime/scripts/release.lua"),
    ),
    (
        Script::Renew,
        "renew.lua",
        include_str!("../../lock-runtime/scripts/renew.lua"),
    ),
    (
        Script::RenewRead,
        "renew_read.lua",
        include_str!("../../lock-runtime/scripts/renew_read.lua"),
    ),
    (
        Script::Keep,
        "keep.lua",
        include_str!("../../lock-runtime/scripts/keep.lua"),
    ),
    (
        Script::RaiseFence,
        "raise_fence.lua",
        include_str!("../../lock-runtime/scripts/raise_fence.lua"),
    ),
    (
        Script::Permit,
        "permit.lua",
        include_str!("../../lock-runtime/scripts/permit.lua"),
    ),
    (
        Script::ReleasePermit,
        "release_permit.lua",
        include_str!("../../lock-runtime/scripts/release_permit.lua"),
    ),
    (
        Script::RenewPermits,
        "renew_permits.lua",
        include_str!("../../lock-runtime/scripts/renew_permits.lua"),
    ),
    (
        Script::KeepPermit,
        "keep_permit.lua",
        include_str!("../../lock-runtime/scripts/keep_permit.lua"),
    ),
    (
        Script::InspectPermits,
        "inspect_permits.lua",
        include_str!("../../lock-runtime/scripts/inspect_permits.lua"),
    ),
    (
        Script::RaisePermitFence,
        "raise_permit_fence.lua",
        include_str!("../../lock-runtime/scripts/raise_permit_fence.lua"),
    ),
    (
        Script::Command,
        "command",
        "return redis.pcall(unpack(ARGV))",
    ),
];

impl Script {
    /// Every script the host runs.
    pub const ALL: [Script; 18] = [
        Script::Acquire,
        Script::Release,
        Script::Renew,
        Script::RenewRead,
        Script::Keep,
        Script::RaiseFence,
        Script::Permit,
        Script::ReleasePermit,
        Script::RenewPermits,
        Script::KeepPermit,
        Script::InspectPermits,
        Script::RaisePermitFence,
        Script::Command,
        Script::AcquireBeforeFixes,
        Script::ReleaseBeforeFixes,
        Script::KeepPermitBeforeFix,
        Script::ReleasePermitBeforeFix,
        Script::PermitOneTooMany,
    ];

    /// The script's source text.
    pub fn source(self) -> Cow<'static, str> {
        if self == Script::AcquireBeforeFixes {
            let (fixed, old) = RACE_3_FIX;
            let today = Script::Acquire.source();
            assert!(
                today.contains(fixed),
                "acquire.lua no longer has race 3's fix as defects::RACE_3_FIX states it: \
                 restate the fix there"
            );
            return Cow::Owned(today.replacen(fixed, old, 1));
        }
        if self == Script::ReleaseBeforeFixes {
            let mut src = Script::Release.source().into_owned();
            for (fixed, old) in DEAD_READER_FIX {
                assert!(
                    src.matches(fixed).count() == 1,
                    "release.lua no longer has item 5's fix as defects::DEAD_READER_FIX \
                     states it (`{fixed}`): restate the fix there"
                );
                src = src.replacen(fixed, old, 1);
            }
            return Cow::Owned(src);
        }
        let unfix = |base: Script, fixes: &[(&str, &str)], what: &str| {
            let mut src = base.source().into_owned();
            for (fixed, old) in fixes {
                assert!(
                    src.matches(fixed).count() == 1,
                    "{} no longer has its fix as defects::{what} states it (`{fixed}`): \
                     restate the fix there",
                    base.name()
                );
                src = src.replacen(fixed, old, 1);
            }
            Cow::Owned(src)
        };
        match self {
            Script::KeepPermitBeforeFix => {
                unfix(Script::KeepPermit, &KEEP_PERMIT_FIX, "KEEP_PERMIT_FIX")
            }
            Script::ReleasePermitBeforeFix => {
                unfix(Script::ReleasePermit, &GIVE_UP_FIX, "GIVE_UP_FIX")
            }
            Script::PermitOneTooMany => unfix(Script::Permit, &ONE_TOO_MANY, "ONE_TOO_MANY"),
            _ => Cow::Borrowed(SOURCES.iter().find(|s| s.0 == self).unwrap().2),
        }
    }

    /// The file it comes from.
    pub fn name(self) -> &'static str {
        if self == Script::AcquireBeforeFixes {
            return "acquire.lua (race 3's fix taken out)";
        }
        if self == Script::ReleaseBeforeFixes {
            return "release.lua (item 5's fix taken out)";
        }
        if self == Script::KeepPermitBeforeFix {
            return "keep_permit.lua (its fix taken out)";
        }
        if self == Script::ReleasePermitBeforeFix {
            return "release_permit.lua (its fix taken out)";
        }
        if self == Script::PermitOneTooMany {
            return "permit.lua (admitting one too many)";
        }
        SOURCES.iter().find(|s| s.0 == self).unwrap().1
    }
}

/// What a script call had to work with and what it left.
struct Ctx {
    ks: Keyspace,
    now: u64,
    subscribers: BTreeMap<String, i64>,
    published: Vec<(String, String)>,
}

/// What one script call did besides changing the keyspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    /// `(channel, message)` for each PUBLISH/SPUBLISH, in order.
    pub published: Vec<(String, String)>,
}

struct Host {
    lua: Lua,
    scripts: Vec<(Script, Function)>,
    run: Function,
}

thread_local! {
    static HOST: RefCell<Option<Host>> = const { RefCell::new(None) };
}

/// Run `script` against `ks` at server time `now` (ms since the epoch),
/// with `subscribers` (channel → count) answering PUBLISH.
pub fn eval(
    script: Script,
    ks: &mut Keyspace,
    now: u64,
    subscribers: &BTreeMap<String, i64>,
    keys: &[&str],
    args: &[&str],
) -> Outcome {
    HOST.with(|h| {
        let mut h = h.borrow_mut();
        let host = h.get_or_insert_with(Host::new);
        host.eval(script, ks, now, subscribers, keys, args)
    })
}

impl Host {
    fn new() -> Host {
        let lua = Lua::new();
        let g = lua.globals();
        let redis = lua.create_table().unwrap();
        let raw = lua
            .create_function(|lua, args: MultiValue| {
                let mut argv = Vec::with_capacity(args.len());
                for a in args.iter() {
                    match a {
                        Value::String(s) => argv.push(s.to_string_lossy()),
                        Value::Integer(i) => argv.push(i.to_string()),
                        Value::Number(n) => argv.push(fmt_g17(*n)),
                        _ => return to_lua(
                            lua,
                            &Reply::Error(
                                "ERR Lua redis lib command arguments must be strings or integers"
                                    .into(),
                            ),
                        ),
                    }
                }
                let reply = {
                    let mut ctx = lua
                        .app_data_mut::<Ctx>()
                        .expect("a script call in progress");
                    let Ctx {
                        ks,
                        now,
                        subscribers,
                        published,
                    } = &mut *ctx;
                    let subs = |c: &str| subscribers.get(c).copied().unwrap_or(0);
                    ks.command(*now, &argv, &subs, published)
                };
                to_lua(lua, &reply)
            })
            .unwrap();
        redis.set("__raw", raw).unwrap();
        g.set("redis", redis).unwrap();
        lua.load(
            r#"
            redis.pcall = function(...) return redis.__raw(...) end
            redis.call = function(...)
              local r = redis.__raw(...)
              if type(r) == 'table' and r.err then error(r, 0) end
              return r
            end
            redis.error_reply = function(e) return {err = e} end
            redis.status_reply = function(s) return {ok = s} end
            function __run(f)
              local ok, res = pcall(f)
              if ok then return true, res end
              if type(res) == 'table' and res.err then return false, res.err end
              return false, 'ERR ' .. tostring(res)
            end
            "#,
        )
        .exec()
        .unwrap();
        let scripts = Script::ALL
            .iter()
            .map(|&s| {
                let f = lua
                    .load(s.source().as_ref())
                    .set_name(s.name())
                    .into_function()
                    .unwrap_or_else(|e| panic!("{} does not compile: {e}", s.name()));
                (s, f)
            })
            .collect();
        let run = g.get::<Function>("__run").unwrap();
        Host { lua, scripts, run }
    }

    fn eval(
        &mut self,
        script: Script,
        ks: &mut Keyspace,
        now: u64,
        subscribers: &BTreeMap<String, i64>,
        keys: &[&str],
        args: &[&str],
    ) -> Outcome {
        let lua = &self.lua;
        let g = lua.globals();
        g.set("KEYS", keys.to_vec()).unwrap();
        g.set("ARGV", args.to_vec()).unwrap();
        lua.set_app_data(Ctx {
            ks: std::mem::take(ks),
            now,
            subscribers: subscribers.clone(),
            published: Vec::new(),
        });
        let f = &self.scripts.iter().find(|s| s.0 == script).unwrap().1;
        let out = self.run.call::<(bool, Value)>(f.clone());
        let ctx = lua.remove_app_data::<Ctx>().unwrap();
        *ks = ctx.ks;
        let reply = match out {
            Ok((true, v)) => from_lua(&v),
            Ok((false, Value::String(e))) => Reply::Error(e.to_string_lossy()),
            Ok((false, v)) => Reply::Error(format!("ERR {v:?}")),
            Err(e) => panic!("{}: the host failed: {e}", script.name()),
        };
        Outcome {
            reply,
            published: ctx.published,
        }
    }
}

/// A Redis reply as a Lua value inside a script.
fn to_lua(lua: &Lua, r: &Reply) -> mlua::Result<Value> {
    Ok(match r {
        Reply::Int(i) => Value::Number(*i as f64),
        Reply::Bulk(s) => Value::String(lua.create_string(s)?),
        Reply::Nil => Value::Boolean(false),
        Reply::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
        Reply::Status(s) => {
            let t = lua.create_table()?;
            t.raw_set("ok", s.as_str())?;
            Value::Table(t)
        }
        Reply::Error(s) => {
            let t = lua.create_table()?;
            t.raw_set("err", s.as_str())?;
            Value::Table(t)
        }
    })
}

/// A script's return value as Redis sends it to the client.
fn from_lua(v: &Value) -> Reply {
    match v {
        Value::Nil => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Boolean(false) => Reply::Nil,
        Value::Integer(i) => Reply::Int(*i),
        Value::Number(n) => Reply::Int(c_cast(*n)),
        Value::String(s) => Reply::Bulk(s.to_string_lossy()),
        Value::Table(t) => table_reply(t),
        other => panic!("a script returned {other:?}, which Redis cannot send"),
    }
}

/// A Lua number as Redis truncates it into an integer reply: C's cast,
/// which on x86-64 gives `i64::MIN` for anything out of range (Rust's `as`
/// saturates instead).
fn c_cast(n: f64) -> i64 {
    if n.is_nan() || !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&n) {
        i64::MIN
    } else {
        n as i64
    }
}

fn table_reply(t: &Table) -> Reply {
    if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
        return Reply::Error(e.to_string_lossy());
    }
    if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
        return Reply::Status(s.to_string_lossy());
    }
    let mut items = Vec::new();
    let mut i = 1;
    loop {
        match t.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(v) => items.push(from_lua(&v)),
        }
        i += 1;
    }
    Reply::Array(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_acquire_takes_the_lock_and_raises_the_counter() {
        let mut ks = Keyspace::default();
        let now = 1_700_000_000_123;
        let keys = ["l", "fence"];
        let out = eval(
            Script::Acquire,
            &mut ks,
            now,
            &BTreeMap::new(),
            &keys,
            &["c:1", "3000", "", "f", "86400000"],
        );
        assert_eq!(
            out.reply,
            Reply::Array(vec![Reply::Int(1), Reply::Bulk("1700000000123000".into())])
        );
        let again = eval(
            Script::Acquire,
            &mut ks,
            now + 5,
            &BTreeMap::new(),
            &keys,
            &["c:1", "3000", "", "f", "86400000"],
        );
        assert_eq!(
            again.reply,
            Reply::Array(vec![Reply::Int(2), Reply::Bulk("1700000000123000".into())])
        );
        // (The repeat raised the counter too: a gap, and its TTL renewed.)
        assert_eq!(ks.keys["fence"].expires, Some(now + 5 + 86_400_000));
        assert_eq!(ks.keys["l"].expires, Some(now + 5 + 3000));
    }
}
