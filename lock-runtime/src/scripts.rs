//! The Lua scripts every Redis-speaking backend runs, one copy each.

use redis::{Cmd, ErrorKind, RedisError, RedisWrite, ToRedisArgs};

/// A script called by EVALSHA; loaded on first NOSCRIPT.
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) source: &'static str,
    pub(crate) sha: &'static std::sync::LazyLock<String>,
}

macro_rules! script {
    ($ident:ident, $sha:ident, $file:literal) => {
        static $sha: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| redis::Script::new($ident.source).get_hash().to_owned());
        pub(crate) static $ident: Script = Script {
            name: $file,
            source: include_str!(concat!("../scripts/", $file)),
            sha: &$sha,
        };
    };
}

script!(ACQUIRE, ACQUIRE_SHA, "acquire.lua");
script!(RENEW, RENEW_SHA, "renew.lua");
script!(RELEASE, RELEASE_SHA, "release.lua");
script!(RAISE_FENCE, RAISE_FENCE_SHA, "raise_fence.lua");
script!(RENEW_READ, RENEW_READ_SHA, "renew_read.lua");
script!(KEEP, KEEP_SHA, "keep.lua");
script!(INSPECT, INSPECT_SHA, "inspect.lua");
// Semaphores (docs/SEMAPHORES.md).
script!(PERMIT, PERMIT_SHA, "permit.lua");
script!(RELEASE_PERMIT, RELEASE_PERMIT_SHA, "release_permit.lua");
script!(RENEW_PERMITS, RENEW_PERMITS_SHA, "renew_permits.lua");
script!(KEEP_PERMIT, KEEP_PERMIT_SHA, "keep_permit.lua");
script!(INSPECT_PERMITS, INSPECT_PERMITS_SHA, "inspect_permits.lua");
script!(
    RAISE_PERMIT_FENCE,
    RAISE_PERMIT_FENCE_SHA,
    "raise_permit_fence.lua"
);

pub(crate) const ALL: [&Script; 13] = [
    &ACQUIRE,
    &RENEW,
    &RELEASE,
    &RAISE_FENCE,
    &RENEW_READ,
    &KEEP,
    &INSPECT,
    &PERMIT,
    &RELEASE_PERMIT,
    &RENEW_PERMITS,
    &KEEP_PERMIT,
    &INSPECT_PERMITS,
    &RAISE_PERMIT_FENCE,
];

/// One argument of a script call, written straight into the command: a
/// number costs no string of its own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Str(&'a str),
    Num(u64),
    /// A number behind a one-letter tag (`w1500`).
    Tagged(char, u64),
}

impl Arg<'_> {
    /// Bytes it takes, at most.
    fn len(&self) -> usize {
        match self {
            Arg::Str(s) => s.len(),
            Arg::Num(_) => 20,
            Arg::Tagged(..) => 24,
        }
    }
}

impl ToRedisArgs for Arg<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        match *self {
            Arg::Str(s) => out.write_arg(s.as_bytes()),
            Arg::Num(n) => out.write_arg_fmt(n),
            Arg::Tagged(tag, n) => out.write_arg_fmt(format_args!("{tag}{n}")),
        }
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(s: &'a str) -> Self {
        Arg::Str(s)
    }
}

impl Script {
    /// `EVALSHA sha numkeys keys.. args..`, in one buffer sized for it.
    pub(crate) fn evalsha(&self, keys: &[&str], args: &[Arg<'_>]) -> Cmd {
        self.call("EVALSHA", self.sha.as_str(), keys, args)
    }

    /// `EVAL source numkeys keys.. args..`: runs and caches the script on
    /// the node that owns the keys (what a cluster needs after NOSCRIPT).
    pub(crate) fn eval(&self, keys: &[&str], args: &[Arg<'_>]) -> Cmd {
        self.call("EVAL", self.source, keys, args)
    }

    fn call(&self, verb: &str, script: &str, keys: &[&str], args: &[Arg<'_>]) -> Cmd {
        let bytes = verb.len()
            + script.len()
            + 4
            + keys.iter().map(|k| k.len()).sum::<usize>()
            + args.iter().map(Arg::len).sum::<usize>();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
        cmd.arg(verb)
            .arg(script)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    }

    /// `SCRIPT LOAD source`, sent once when Redis answers NOSCRIPT.
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }
}

/// Redis lost our scripts (restart, `SCRIPT FLUSH`, failover).
pub(crate) fn is_noscript(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || err.code() == Some("NOSCRIPT")
}
