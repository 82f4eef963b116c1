use std::sync::Arc;

use crate::LockError;

/// The Redis names that belong to one user key.
///
/// The user's key sits inside a hash tag so that the lock, the fence
/// counter and the wake-up channel share one Redis Cluster slot. Shared
/// behind one `Arc`: the watchdog copies the names of every held lock on
/// each tick.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LockName(Arc<Names>);

#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Names {
    /// The key the user asked for (without prefix).
    pub(crate) key: Arc<str>,
    /// `prefix{key}`: the lock, holding its owner id. The lock's other
    /// names are made from it when needed, so that a held lock costs the
    /// watchdog two strings, not seven.
    pub(crate) hash: Arc<str>,
}

/// Longest key we accept; longer keys are almost certainly a bug (a body
/// formatted into the key) and would bloat every command.
const MAX_KEY_LEN: usize = 1024;

impl LockName {
    pub(crate) fn new(prefix: &str, key: &str) -> Result<Self, LockError> {
        let invalid = |reason: &str| LockError::InvalidKey {
            key: key.to_owned(),
            reason: reason.to_owned(),
        };
        if key.is_empty() {
            return Err(invalid("the key is empty; name the resource to lock"));
        }
        if key.len() > MAX_KEY_LEN {
            return Err(invalid("the key is longer than 1024 bytes"));
        }
        if key.starts_with('}') {
            return Err(invalid(
                "a key may not start with `}`: it would empty the Redis Cluster hash tag",
            ));
        }
        Ok(Self::named(key.into(), tagged(prefix, key)))
    }

    /// The lock whose grant channel is `channel`
    /// (`<prefix>{<key>}:granted:<client id>`), for a client whose key
    /// prefix is `prefix`.
    pub(crate) fn of_grant_channel(channel: &str, prefix: &str) -> Option<Self> {
        let hash = &channel[..channel.rfind(":granted:")?];
        let key = hash
            .strip_prefix(prefix)?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        Some(Self::named(key.into(), hash.into()))
    }

    /// The key prefix this name was made with.
    pub(crate) fn prefix(&self) -> &str {
        &self.hash[..self.hash.len() - self.key.len() - 2]
    }

    fn named(key: Arc<str>, hash: Arc<str>) -> Self {
        LockName(Arc::new(Names { key, hash }))
    }

    /// The token counter this lock's tokens come from: one for every lock
    /// of a hash slot, so that nothing is kept per lock name. On one
    /// server, `prefix` + `fence`; on a Redis Cluster, `prefix` +
    /// `fence{<tag>}` with a tag that lands in the lock's slot (a script
    /// touches one slot only). It expires unused after the client's
    /// `fence_ttl`.
    pub(crate) fn counter(&self, cluster: bool) -> String {
        if cluster {
            let tag = crate::slots::tag_for(crate::slots::slot_of(&self.hash));
            format!("{}fence{{{tag}}}", self.prefix())
        } else {
            format!("{}fence", self.prefix())
        }
    }

    /// `prefix{key}:released`: the channel a release publishes on for
    /// waiters that do not queue (Redlock).
    pub(crate) fn channel(&self) -> Arc<str> {
        format!("{}:released", self.hash).into()
    }

    /// `prefix{key}:queue`: owner ids waiting, first come first served.
    pub(crate) fn queue(&self) -> String {
        format!("{}:queue", self.hash)
    }

    /// `prefix{key}:waiters`: each queued owner's lease and deadline.
    pub(crate) fn waiters(&self) -> String {
        format!("{}:waiters", self.hash)
    }

    /// `prefix{key}:readers`: a read-held lock's readers, a sorted set
    /// scored by the end of each one's own lease (server ms).
    pub(crate) fn readers(&self) -> String {
        format!("{}:readers", self.hash)
    }

    /// `prefix{key}:granted:`: followed by a client id, the channel on
    /// which that client hears the grants handed to its waiters.
    pub(crate) fn grants(&self) -> String {
        format!("{}:granted:", self.hash)
    }

    /// The channel on which `client` hears grants of this lock.
    pub(crate) fn grant_channel(&self, client: &str) -> Arc<str> {
        format!("{}:granted:{client}", self.hash).into()
    }

    /// The user key behind a Redis name that a held or awaited lock has
    /// (the lock, its queue, waiters or readers), as found by a scan; `None`
    /// for anything else, the fence counter included: it outlives its lock,
    /// and a key with nothing else is neither held nor awaited.
    pub(crate) fn key_of(prefix: &str, redis_name: &str) -> Option<String> {
        let tagged = redis_name.strip_prefix(prefix)?.strip_prefix('{')?;
        // The key may itself hold `}`: the lock's own name ends with the
        // last one, a side name's key ends before its last `}:`.
        let key = match tagged.strip_suffix('}') {
            Some(key) => key,
            None => &tagged[..tagged.rfind("}:")?],
        };
        let name = LockName::new(prefix, key).ok()?;
        let ours = *name.hash == *redis_name
            || [name.queue(), name.waiters(), name.readers()]
                .iter()
                .any(|n| n == redis_name);
        ours.then(|| key.to_owned())
    }
}

/// `prefix{key}`, made straight into its shared string (one allocation,
/// not a `String` grown and then copied, for the usual short names).
fn tagged(prefix: &str, key: &str) -> Arc<str> {
    const SHORT: usize = 192;
    let len = prefix.len() + key.len() + 2;
    if len > SHORT {
        return format!("{prefix}{{{key}}}").into();
    }
    let mut buf = [0u8; SHORT];
    let parts: [&[u8]; 4] = [prefix.as_bytes(), b"{", key.as_bytes(), b"}"];
    let mut at = 0;
    for part in parts {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    // Whole UTF-8 strings and ASCII braces, in order: UTF-8.
    std::str::from_utf8(&buf[..len]).map_or_else(|_| format!("{prefix}{{{key}}}").into(), Arc::from)
}

/// Whether an owner id is a reader's (`<client id>:r<n>`): every backend
/// tells a read hold from a write hold by its owner id, so the mode needs
/// no field of its own anywhere a hold is kept.
pub(crate) fn is_reader(owner: &str) -> bool {
    owner
        .find(':')
        .is_some_and(|i| owner.as_bytes().get(i + 1) == Some(&b'r'))
}

/// What a hold or a request is: the one thing every backend switches on.
/// Kept in the owner id (`<client id>:<n>` a writer, `<client id>:r<n>` a
/// reader, `<client id>:s<permits>.<n>` a permit of a semaphore admitting
/// `permits` holders), so that every record naming an owner (the lock, a
/// semaphore's hash field, a queue entry, a renewal) says it without a field
/// of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Mode {
    /// The exclusive lock.
    Write,
    /// A shared read lock.
    Read,
    /// One permit of a semaphore that admits at most `permits` holders
    /// (never 0).
    Permit(u32),
}

impl Mode {
    /// The mode an owner id says.
    pub(crate) fn of(owner: &str) -> Mode {
        let Some(i) = owner.find(':') else {
            return Mode::Write;
        };
        let rest = &owner[i + 1..];
        match rest.as_bytes().first() {
            Some(b'r') => Mode::Read,
            Some(b's') => rest[1..]
                .split('.')
                .next()
                .and_then(|n| n.parse().ok())
                .filter(|&n| n > 0)
                .map_or(Mode::Write, Mode::Permit),
            _ => Mode::Write,
        }
    }

    /// A new owner id of this mode for `client`, unique by `n`.
    pub(crate) fn owner(self, client: &str, n: u64) -> Arc<str> {
        match self {
            Mode::Write => format!("{client}:{n}"),
            Mode::Read => format!("{client}:r{n}"),
            Mode::Permit(permits) => format!("{client}:s{permits}.{n}"),
        }
        .into()
    }

    /// What metrics (label `mode`) and spans (field `mode`) call it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Write => "write",
            Mode::Read => "read",
            Mode::Permit(_) => "semaphore",
        }
    }

    /// The semaphore's size, for a permit.
    pub(crate) fn permits(self) -> Option<u32> {
        match self {
            Mode::Permit(n) => Some(n),
            _ => None,
        }
    }
}

/// The client id at the front of an owner id (`<client id>:<n>`).
pub(crate) fn client_of(owner: &str) -> &str {
    owner.split(':').next().unwrap_or(owner)
}

impl std::ops::Deref for LockName {
    type Target = Names;

    fn deref(&self) -> &Names {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_hash_tag() {
        let n = LockName::new("lock:", "order:42").unwrap();
        assert_eq!(&*n.hash, "lock:{order:42}");
        assert_eq!(n.counter(false), "lock:fence");
        let on_cluster = n.counter(true);
        assert!(on_cluster.starts_with("lock:fence{"), "{on_cluster}");
        assert_eq!(
            crate::slots::slot_of(&on_cluster),
            crate::slots::slot_of(&n.hash),
            "the counter shares the lock's slot"
        );
        assert_eq!(&*n.channel(), "lock:{order:42}:released");
        assert_eq!(n.queue(), "lock:{order:42}:queue");
        assert_eq!(n.waiters(), "lock:{order:42}:waiters");
        assert_eq!(n.readers(), "lock:{order:42}:readers");
        assert!(is_reader("c1:r7") && !is_reader("c1:7") && !is_reader("r:7"));
        assert_eq!(Mode::of("c1:s4.7"), Mode::Permit(4));
        assert_eq!(Mode::of("c1:r7"), Mode::Read);
        assert_eq!(Mode::of("c1:7"), Mode::Write);
        assert_eq!(Mode::of("c1:s0.7"), Mode::Write);
        for mode in [Mode::Write, Mode::Read, Mode::Permit(12)] {
            assert_eq!(Mode::of(&mode.owner("c1", 7)), mode);
        }
        assert!(!is_reader("c1:s2.9"));
        assert_eq!(n.grants(), "lock:{order:42}:granted:");
        assert_eq!(&*n.grant_channel("c1"), "lock:{order:42}:granted:c1");
        let back = LockName::of_grant_channel(&n.grant_channel("c1"), "lock:").unwrap();
        assert_eq!(back, n);
        assert!(LockName::of_grant_channel(&n.grant_channel("c1"), "other:").is_none());
    }

    #[test]
    fn a_scanned_name_gives_its_key_unless_it_is_a_fence_counter() {
        let n = LockName::new("lock:", "order:42").unwrap();
        for name in [n.hash.to_string(), n.queue(), n.waiters(), n.readers()] {
            assert_eq!(
                LockName::key_of("lock:", &name).as_deref(),
                Some("order:42")
            );
        }
        assert_eq!(LockName::key_of("lock:", &n.counter(false)), None);
        assert_eq!(LockName::key_of("lock:", &n.counter(true)), None);
        assert_eq!(LockName::key_of("other:", &n.hash), None);
        assert_eq!(LockName::key_of("lock:", "lock:{order:42}:other"), None);
        assert_eq!(LockName::key_of("lock:", "lock:order:42"), None);
        // Keys holding `}` or a side name's suffix are found whole.
        for key in ["a}b{c", "x}:queue", "y}:queue}"] {
            let n = LockName::new("lock:", key).unwrap();
            for name in [n.hash.to_string(), n.queue(), n.readers()] {
                assert_eq!(LockName::key_of("lock:", &name).as_deref(), Some(key));
            }
        }
    }

    #[test]
    fn rejects_empty_and_tag_breaking_keys() {
        assert!(matches!(
            LockName::new("lock:", ""),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(matches!(
            LockName::new("lock:", "}x"),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(LockName::new("lock:", "a}b{c").is_ok());
    }
}
