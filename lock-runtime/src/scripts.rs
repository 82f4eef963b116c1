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

/// The `fence_ttl` the scripts take when it is left out of a call (the
/// client's default): one argument less for the server to read.
pub(crate) const DEFAULT_FENCE_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// One argument of a script call, written straight into the command: a
/// number costs no string of its own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Str(&'a str),
    Num(u64),
    /// A number behind a one-letter tag (`w1500`).
    Tagged(char, u64),
    /// A string, a space and a number: a hold's value, `<owner> <token>`.
    Held(&'a str, u64),
}

impl Arg<'_> {
    /// Bytes it takes, at most.
    fn len(&self) -> usize {
        match self {
            Arg::Str(s) => s.len(),
            Arg::Num(_) => 20,
            Arg::Tagged(..) => 24,
            Arg::Held(s, _) => s.len() + 21,
        }
    }
}

impl ToRedisArgs for Arg<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // Digits written by hand: `fmt` machinery was a visible part of
        // what a lock costs the client.
        let mut buf = [0u8; 24];
        match *self {
            Arg::Str(s) => out.write_arg(s.as_bytes()),
            Arg::Num(n) => out.write_arg(decimal(n, &mut buf)),
            Arg::Tagged(tag, n) => {
                let mut tagged = [0u8; 28];
                let tag = tag.encode_utf8(&mut tagged).len();
                let digits = decimal(n, &mut buf);
                tagged[tag..tag + digits.len()].copy_from_slice(digits);
                out.write_arg(&tagged[..tag + digits.len()]);
            }
            Arg::Held(s, n) => {
                let digits = decimal(n, &mut buf);
                let len = s.len() + 1 + digits.len();
                // On the stack for every owner id the client makes.
                let mut small = [0u8; 96];
                let mut large = Vec::new();
                let held: &mut [u8] = if len <= small.len() {
                    &mut small[..len]
                } else {
                    large.resize(len, 0);
                    &mut large
                };
                held[..s.len()].copy_from_slice(s.as_bytes());
                held[s.len()] = b' ';
                held[s.len() + 1..].copy_from_slice(digits);
                out.write_arg(held);
            }
        }
    }
}

/// `n` in decimal, at the end of `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 24]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_in_decimal() {
        let mut buf = [0u8; 24];
        for n in [0, 7, 10, 1_718_000_000_000_001, u64::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
        let mut cmd = Cmd::new();
        cmd.arg(Arg::Num(1500))
            .arg(Arg::Tagged('w', 0))
            .arg(Arg::Tagged('w', 1500))
            .arg(Arg::Str("a b"))
            .arg(Arg::Held("c1:7", 1_718_000_000_000_001))
            .arg(Arg::Held(&"o".repeat(100), 42));
        let args: Vec<&[u8]> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b,
                _ => &[],
            })
            .collect();
        let long = format!("{} 42", "o".repeat(100));
        assert_eq!(
            args,
            [
                &b"1500"[..],
                b"w0",
                b"w1500",
                b"a b",
                b"c1:7 1718000000000001",
                long.as_bytes()
            ]
        );
    }
}
