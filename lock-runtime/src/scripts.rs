//! The Lua scripts every Redis-speaking backend runs, one copy each.

use redis::{Cmd, ErrorKind, RedisError};

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

pub(crate) const ALL: [&Script; 7] = [
    &ACQUIRE,
    &RENEW,
    &RELEASE,
    &RAISE_FENCE,
    &RENEW_READ,
    &KEEP,
    &INSPECT,
];

impl Script {
    /// `EVALSHA sha numkeys keys.. args..`.
    pub(crate) fn evalsha(&self, keys: &[&str], args: &[&str]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.sha.as_str())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    }

    /// `EVAL source numkeys keys.. args..`: runs and caches the script on
    /// the node that owns the keys (what a cluster needs after NOSCRIPT).
    pub(crate) fn eval(&self, keys: &[&str], args: &[&str]) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.source).arg(keys.len()).arg(keys).arg(args);
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
