//! A Redis keyspace small enough to be model state: strings, hashes,
//! lists and sorted sets with expiry in ms on the model's clock, and the
//! commands the lock scripts call, with Redis 7.0's reply shapes and error
//! texts (checked against a real `redis-server` in `tests/host_vs_redis.rs`).
//!
//! Everything is a `BTreeMap` or a `Vec`: deterministic iteration, cheap
//! `Clone`, and `Hash + Eq` for the checker's fingerprints.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// A Redis reply, as the protocol has it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Int(i64),
    Bulk(String),
    Nil,
    Array(Vec<Reply>),
    Status(String),
    Error(String),
}

/// A sorted set's score: a double with a total order, hashable by its bits.
#[derive(Debug, Clone, Copy)]
pub struct Score(pub f64);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0) == Ordering::Equal
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}
impl Hash for Score {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}

/// A hash's fields in Redis's order for small hashes (a listpack, below
/// `hash-max-listpack-entries`): as first set, an update kept in place, a
/// deleted field gone from its place. `HGETALL`, `HKEYS` and `HVALS` answer
/// in this order, so a script that walks a hash walks it as on Redis.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Fields(Vec<(String, String)>);

impl Fields {
    pub fn get(&self, field: &str) -> Option<&String> {
        self.0.iter().find(|(f, _)| f == field).map(|(_, v)| v)
    }
    pub fn contains_key(&self, field: &str) -> bool {
        self.get(field).is_some()
    }
    /// Set `field`; the value it had.
    pub fn insert(&mut self, field: String, value: String) -> Option<String> {
        match self.0.iter_mut().find(|(f, _)| *f == field) {
            Some((_, v)) => Some(std::mem::replace(v, value)),
            None => {
                self.0.push((field, value));
                None
            }
        }
    }
    pub fn remove(&mut self, field: &str) -> Option<String> {
        let i = self.0.iter().position(|(f, _)| f == field)?;
        Some(self.0.remove(i).1)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter().map(|(f, v)| (f, v))
    }
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(f, _)| f)
    }
    pub fn values(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(_, v)| v)
    }
}

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Data {
    Str(String),
    Hash(Fields),
    List(Vec<String>),
    ZSet(BTreeMap<String, Score>),
}

/// One key: its data and when it expires (server ms), if it does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    pub data: Data,
    pub expires: Option<u64>,
}

/// The keyspace of one server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Keyspace {
    pub keys: BTreeMap<String, Entry>,
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INT: &str = "ERR value is not an integer or out of range";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const SYNTAX: &str = "ERR syntax error";
const ARITY: &str = "ERR Wrong number of args calling Redis command from script";

fn err(s: &str) -> Reply {
    Reply::Error(s.to_string())
}

fn ok() -> Reply {
    Reply::Status("OK".into())
}

/// Redis's strict integer parse (`string2ll`).
fn int(s: &str) -> Option<i64> {
    if s.is_empty() || s.starts_with('+') || (s.len() > 1 && s.starts_with('0')) || s == "-0" {
        return None;
    }
    if s.starts_with("-0") {
        return None;
    }
    s.parse().ok()
}

fn float(s: &str) -> Option<f64> {
    match s.to_ascii_lowercase().as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        _ => s.parse::<f64>().ok().filter(|f| !f.is_nan()),
    }
}

/// A double as Redis 7.0 writes it in replies (`%.17g`).
pub fn fmt_double(d: f64) -> String {
    if d.is_infinite() {
        return if d > 0.0 { "inf".into() } else { "-inf".into() };
    }
    fmt_g17(d)
}

/// C's `%.17g`.
pub fn fmt_g17(d: f64) -> String {
    if d == 0.0 {
        return if d.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    if d.is_nan() {
        return "nan".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let p = 17i32;
    let sci = format!("{:.*e}", (p - 1) as usize, d);
    let (mant, exp) = sci.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    if exp < -4 || exp >= p {
        let mant = trim_zeros(mant);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (p - 1 - exp).max(0) as usize;
        trim_zeros(&format!("{:.*}", decimals, d)).to_string()
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// A range bound of ZREMRANGEBYSCORE: value, exclusive.
fn score_bound(s: &str) -> Option<(f64, bool)> {
    match s.strip_prefix('(') {
        Some(rest) => float(rest).map(|f| (f, true)),
        None => float(s).map(|f| (f, false)),
    }
}

impl Keyspace {
    /// Drop every key that expired before `now` (Redis: a key whose time
    /// is `now` still exists, with a PTTL of 0).
    pub fn expire(&mut self, now: u64) {
        self.keys.retain(|_, e| e.expires.is_none_or(|t| t >= now));
    }

    fn live(&self, key: &str, now: u64) -> Option<&Entry> {
        self.keys
            .get(key)
            .filter(|e| e.expires.is_none_or(|t| t >= now))
    }

    fn live_mut(&mut self, key: &str, now: u64) -> Option<&mut Entry> {
        if self.live(key, now).is_none() {
            self.keys.remove(key);
            return None;
        }
        self.keys.get_mut(key)
    }

    /// A key's data if live.
    pub fn get(&self, key: &str, now: u64) -> Option<&Data> {
        self.live(key, now).map(|e| &e.data)
    }

    /// Remove `key` if its collection emptied.
    fn drop_if_empty(&mut self, key: &str) {
        let empty = match self.keys.get(key).map(|e| &e.data) {
            Some(Data::Hash(h)) => h.is_empty(),
            Some(Data::List(l)) => l.is_empty(),
            Some(Data::ZSet(z)) => z.is_empty(),
            _ => false,
        };
        if empty {
            self.keys.remove(key);
        }
    }

    /// Run one command (`argv[0]` is its name) at server time `now` (ms).
    /// `subscribers` answers PUBLISH; `published` collects what was sent.
    /// Panics on a command the shim does not know: a script that gained
    /// one must not be checked against a guess.
    pub fn command(
        &mut self,
        now: u64,
        argv: &[String],
        subscribers: &dyn Fn(&str) -> i64,
        published: &mut Vec<(String, String)>,
    ) -> Reply {
        let Some(name) = argv.first() else {
            return err("ERR Please specify at least one argument for this redis lib call");
        };
        let name = name.to_ascii_uppercase();
        let a = &argv[1..];
        // (min args, max args or usize::MAX), as Redis's arity checks.
        let arity = |min: usize, max: usize| a.len() >= min && a.len() <= max;
        macro_rules! need {
            ($min:expr, $max:expr) => {
                if !arity($min, $max) {
                    return err(ARITY);
                }
            };
        }
        const ANY: usize = usize::MAX;
        match name.as_str() {
            "TIME" => {
                need!(0, 0);
                Reply::Array(vec![
                    Reply::Bulk((now / 1000).to_string()),
                    Reply::Bulk(((now % 1000) * 1000).to_string()),
                ])
            }
            "GET" => {
                need!(1, 1);
                match self.get(&a[0], now) {
                    None => Reply::Nil,
                    Some(Data::Str(s)) => Reply::Bulk(s.clone()),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "SET" => {
                need!(2, ANY);
                self.set(now, a)
            }
            "DEL" | "UNLINK" => {
                need!(1, ANY);
                let mut n = 0;
                for k in a {
                    if self.live(k, now).is_some() {
                        n += 1;
                    }
                    self.keys.remove(k);
                }
                Reply::Int(n)
            }
            "TYPE" => {
                need!(1, 1);
                Reply::Status(
                    match self.get(&a[0], now) {
                        None => "none",
                        Some(Data::Str(_)) => "string",
                        Some(Data::Hash(_)) => "hash",
                        Some(Data::List(_)) => "list",
                        Some(Data::ZSet(_)) => "zset",
                    }
                    .into(),
                )
            }
            "EXISTS" => {
                need!(1, ANY);
                Reply::Int(a.iter().filter(|k| self.live(k, now).is_some()).count() as i64)
            }
            "INCR" | "DECR" | "INCRBY" | "DECRBY" => {
                let by = match name.as_str() {
                    "INCR" | "DECR" => {
                        need!(1, 1);
                        1
                    }
                    _ => {
                        need!(2, 2);
                        match int(&a[1]) {
                            Some(n) => n,
                            None => return err(NOT_INT),
                        }
                    }
                };
                let by = if name.starts_with('D') { -by } else { by };
                let cur = match self.live_mut(&a[0], now) {
                    None => 0,
                    Some(Entry {
                        data: Data::Str(s), ..
                    }) => match int(s) {
                        Some(n) => n,
                        None => return err(NOT_INT),
                    },
                    Some(_) => return err(WRONGTYPE),
                };
                let Some(next) = cur.checked_add(by) else {
                    return err("ERR increment or decrement would overflow");
                };
                match self.keys.get_mut(&a[0]) {
                    Some(e) => e.data = Data::Str(next.to_string()),
                    None => {
                        self.keys.insert(
                            a[0].clone(),
                            Entry {
                                data: Data::Str(next.to_string()),
                                expires: None,
                            },
                        );
                    }
                }
                Reply::Int(next)
            }
            "PEXPIRE" | "EXPIRE" => {
                need!(2, 3);
                let Some(n) = int(&a[1]) else {
                    return err(NOT_INT);
                };
                let ms = if name == "EXPIRE" {
                    n.saturating_mul(1000)
                } else {
                    n
                };
                let flag = a.get(2).map(|f| f.to_ascii_uppercase());
                if !matches!(flag.as_deref(), None | Some("NX" | "XX" | "GT" | "LT")) {
                    return Reply::Error(format!("ERR Unsupported option {}", a[2]));
                }
                let Some(e) = self.live_mut(&a[0], now) else {
                    return Reply::Int(0);
                };
                let when = now as i64 + ms;
                let cur = e.expires;
                let allowed = match flag.as_deref() {
                    None => true,
                    Some("NX") => cur.is_none(),
                    Some("XX") => cur.is_some(),
                    // A key without a TTL counts as an infinite one.
                    Some("GT") => cur.is_some_and(|c| when > c as i64),
                    Some("LT") => cur.is_none_or(|c| when < c as i64),
                    _ => unreachable!(),
                };
                if !allowed {
                    return Reply::Int(0);
                }
                if when <= now as i64 {
                    self.keys.remove(&a[0]);
                } else {
                    e.expires = Some(when as u64);
                }
                Reply::Int(1)
            }
            "PTTL" | "TTL" | "PEXPIRETIME" | "EXPIRETIME" => {
                need!(1, 1);
                let Some(e) = self.live(&a[0], now) else {
                    return Reply::Int(-2);
                };
                let Some(t) = e.expires else {
                    return Reply::Int(-1);
                };
                Reply::Int(match name.as_str() {
                    "PTTL" => t.saturating_sub(now) as i64,
                    "TTL" => (t.saturating_sub(now) as i64 + 500) / 1000,
                    "PEXPIRETIME" => t as i64,
                    _ => t as i64 / 1000,
                })
            }
            "HSET" => {
                if a.len() < 3 || a.len().is_multiple_of(2) {
                    return err(ARITY);
                }
                let h = match self.hash_mut(&a[0], now, true) {
                    Ok(h) => h.unwrap(),
                    Err(e) => return e,
                };
                let mut new = 0;
                for fv in a[1..].chunks(2) {
                    if h.insert(fv[0].clone(), fv[1].clone()).is_none() {
                        new += 1;
                    }
                }
                Reply::Int(new)
            }
            "HGET" => {
                need!(2, 2);
                match self.get(&a[0], now) {
                    None => Reply::Nil,
                    Some(Data::Hash(h)) => h.get(&a[1]).cloned().map_or(Reply::Nil, Reply::Bulk),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "HEXISTS" => {
                need!(2, 2);
                match self.get(&a[0], now) {
                    None => Reply::Int(0),
                    Some(Data::Hash(h)) => Reply::Int(h.contains_key(&a[1]) as i64),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "HLEN" => {
                need!(1, 1);
                match self.get(&a[0], now) {
                    None => Reply::Int(0),
                    Some(Data::Hash(h)) => Reply::Int(h.len() as i64),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "HDEL" => {
                need!(2, ANY);
                let n = match self.hash_mut(&a[0], now, false) {
                    Ok(None) => return Reply::Int(0),
                    Ok(Some(h)) => a[1..].iter().filter(|f| h.remove(f).is_some()).count(),
                    Err(e) => return e,
                };
                self.drop_if_empty(&a[0]);
                Reply::Int(n as i64)
            }
            "HGETALL" | "HKEYS" | "HVALS" => {
                need!(1, 1);
                match self.get(&a[0], now) {
                    None => Reply::Array(vec![]),
                    Some(Data::Hash(h)) => Reply::Array(match name.as_str() {
                        "HGETALL" => h
                            .iter()
                            .flat_map(|(f, v)| [Reply::Bulk(f.clone()), Reply::Bulk(v.clone())])
                            .collect(),
                        "HKEYS" => h.keys().cloned().map(Reply::Bulk).collect(),
                        _ => h.values().cloned().map(Reply::Bulk).collect(),
                    }),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "HMGET" => {
                need!(2, ANY);
                match self.get(&a[0], now) {
                    None => Reply::Array(a[1..].iter().map(|_| Reply::Nil).collect()),
                    Some(Data::Hash(h)) => Reply::Array(
                        a[1..]
                            .iter()
                            .map(|f| h.get(f).cloned().map_or(Reply::Nil, Reply::Bulk))
                            .collect(),
                    ),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "HSETNX" => {
                need!(3, 3);
                let h = match self.hash_mut(&a[0], now, true) {
                    Ok(h) => h.unwrap(),
                    Err(e) => return e,
                };
                if h.contains_key(&a[1]) {
                    return Reply::Int(0);
                }
                h.insert(a[1].clone(), a[2].clone());
                Reply::Int(1)
            }
            "HINCRBY" => {
                need!(3, 3);
                let Some(by) = int(&a[2]) else {
                    return err(NOT_INT);
                };
                let h = match self.hash_mut(&a[0], now, true) {
                    Ok(h) => h.unwrap(),
                    Err(e) => return e,
                };
                let cur = match h.get(&a[1]) {
                    None => 0,
                    Some(v) => match int(v) {
                        Some(n) => n,
                        None => {
                            self.drop_if_empty(&a[0]);
                            return err("ERR hash value is not an integer");
                        }
                    },
                };
                let Some(next) = cur.checked_add(by) else {
                    self.drop_if_empty(&a[0]);
                    return err("ERR increment or decrement would overflow");
                };
                h.insert(a[1].clone(), next.to_string());
                Reply::Int(next)
            }
            "RPUSH" | "LPUSH" => {
                need!(2, ANY);
                let l = match self.list_mut(&a[0], now, true) {
                    Ok(l) => l.unwrap(),
                    Err(e) => return e,
                };
                for v in &a[1..] {
                    if name == "RPUSH" {
                        l.push(v.clone());
                    } else {
                        l.insert(0, v.clone());
                    }
                }
                Reply::Int(l.len() as i64)
            }
            "LPOP" | "RPOP" => {
                need!(1, 2);
                let count = match a.get(1) {
                    None => None,
                    Some(c) => match int(c) {
                        Some(n) if n >= 0 => Some(n as usize),
                        _ => return err("ERR value is out of range, must be positive"),
                    },
                };
                let out = match self.list_mut(&a[0], now, false) {
                    Ok(None) => return Reply::Nil,
                    Ok(Some(l)) => {
                        let n = count.unwrap_or(1).min(l.len());
                        let taken: Vec<String> = if name == "LPOP" {
                            l.drain(..n).collect()
                        } else {
                            let at = l.len() - n;
                            l.drain(at..).rev().collect()
                        };
                        match count {
                            None => Reply::Bulk(taken.into_iter().next().unwrap()),
                            Some(_) => Reply::Array(taken.into_iter().map(Reply::Bulk).collect()),
                        }
                    }
                    Err(e) => return e,
                };
                self.drop_if_empty(&a[0]);
                out
            }
            "LLEN" => {
                need!(1, 1);
                match self.get(&a[0], now) {
                    None => Reply::Int(0),
                    Some(Data::List(l)) => Reply::Int(l.len() as i64),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "LINDEX" => {
                need!(2, 2);
                let Some(i) = int(&a[1]) else {
                    return err(NOT_INT);
                };
                match self.get(&a[0], now) {
                    None => Reply::Nil,
                    Some(Data::List(l)) => {
                        let i = if i < 0 { l.len() as i64 + i } else { i };
                        if i < 0 {
                            return Reply::Nil;
                        }
                        l.get(i as usize).cloned().map_or(Reply::Nil, Reply::Bulk)
                    }
                    Some(_) => err(WRONGTYPE),
                }
            }
            "LRANGE" => {
                need!(3, 3);
                let (Some(s), Some(e)) = (int(&a[1]), int(&a[2])) else {
                    return err(NOT_INT);
                };
                match self.get(&a[0], now) {
                    None => Reply::Array(vec![]),
                    Some(Data::List(l)) => Reply::Array(
                        range(l.len(), s, e)
                            .map(|i| Reply::Bulk(l[i].clone()))
                            .collect(),
                    ),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "LREM" => {
                need!(3, 3);
                let Some(count) = int(&a[1]) else {
                    return err(NOT_INT);
                };
                let n = match self.list_mut(&a[0], now, false) {
                    Ok(None) => return Reply::Int(0),
                    Ok(Some(l)) => {
                        let limit = if count == 0 {
                            usize::MAX
                        } else {
                            count.unsigned_abs() as usize
                        };
                        let mut removed = 0;
                        if count >= 0 {
                            let mut i = 0;
                            while i < l.len() && removed < limit {
                                if l[i] == a[2] {
                                    l.remove(i);
                                    removed += 1;
                                } else {
                                    i += 1;
                                }
                            }
                        } else {
                            let mut i = l.len();
                            while i > 0 && removed < limit {
                                i -= 1;
                                if l[i] == a[2] {
                                    l.remove(i);
                                    removed += 1;
                                }
                            }
                        }
                        removed
                    }
                    Err(e) => return e,
                };
                self.drop_if_empty(&a[0]);
                Reply::Int(n as i64)
            }
            "LPOS" => {
                need!(2, ANY);
                // RANK, COUNT, MAXLEN as Redis has them.
                let mut rank: i64 = 1;
                let mut count: Option<usize> = None;
                let mut maxlen = 0usize;
                let mut i = 2;
                while i < a.len() {
                    let opt = a[i].to_ascii_uppercase();
                    let Some(v) = a.get(i + 1) else {
                        return err(SYNTAX);
                    };
                    let Some(n) = int(v) else {
                        return err(NOT_INT);
                    };
                    match opt.as_str() {
                        "RANK" if n != 0 && n != i64::MIN => rank = n,
                        "RANK" => return err("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list"),
                        "COUNT" if n >= 0 => count = Some(n as usize),
                        "COUNT" => return err("ERR COUNT can't be negative"),
                        "MAXLEN" if n >= 0 => maxlen = n as usize,
                        "MAXLEN" => return err("ERR MAXLEN can't be negative"),
                        _ => return err(SYNTAX),
                    }
                    i += 2;
                }
                let l = match self.get(&a[0], now) {
                    None => {
                        return match count {
                            Some(_) => Reply::Array(vec![]),
                            None => Reply::Nil,
                        }
                    }
                    Some(Data::List(l)) => l,
                    Some(_) => return err(WRONGTYPE),
                };
                let idx: Vec<usize> = if rank > 0 {
                    (0..l.len()).collect()
                } else {
                    (0..l.len()).rev().collect()
                };
                let scan = if maxlen == 0 { idx.len() } else { maxlen.min(idx.len()) };
                let mut skip = rank.unsigned_abs() as usize - 1;
                let want = match count {
                    None => 1,
                    Some(0) => usize::MAX,
                    Some(c) => c,
                };
                let mut found = Vec::new();
                for &j in &idx[..scan] {
                    if l[j] == a[1] {
                        if skip > 0 {
                            skip -= 1;
                            continue;
                        }
                        found.push(j);
                        if found.len() >= want {
                            break;
                        }
                    }
                }
                match count {
                    None => found.first().map_or(Reply::Nil, |&j| Reply::Int(j as i64)),
                    Some(_) => Reply::Array(found.into_iter().map(|j| Reply::Int(j as i64)).collect()),
                }
            }
            "ZADD" => self.zadd(now, a),
            "ZSCORE" => {
                need!(2, 2);
                match self.get(&a[0], now) {
                    None => Reply::Nil,
                    Some(Data::ZSet(z)) => z
                        .get(&a[1])
                        .map_or(Reply::Nil, |s| Reply::Bulk(fmt_double(s.0))),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "ZCARD" => {
                need!(1, 1);
                match self.get(&a[0], now) {
                    None => Reply::Int(0),
                    Some(Data::ZSet(z)) => Reply::Int(z.len() as i64),
                    Some(_) => err(WRONGTYPE),
                }
            }
            "ZREM" => {
                need!(2, ANY);
                let n = match self.get(&a[0], now) {
                    None => return Reply::Int(0),
                    Some(Data::ZSet(_)) => {
                        let Some(Data::ZSet(z)) = self.keys.get_mut(&a[0]).map(|e| &mut e.data)
                        else {
                            unreachable!()
                        };
                        a[1..].iter().filter(|m| z.remove(*m).is_some()).count()
                    }
                    Some(_) => return err(WRONGTYPE),
                };
                self.drop_if_empty(&a[0]);
                Reply::Int(n as i64)
            }
            "ZRANGE" => {
                need!(3, 4);
                let withscores = match a.get(3) {
                    None => false,
                    Some(w) if w.eq_ignore_ascii_case("WITHSCORES") => true,
                    Some(_) => return err(SYNTAX),
                };
                let (Some(s), Some(e)) = (int(&a[1]), int(&a[2])) else {
                    return err(NOT_INT);
                };
                match self.get(&a[0], now) {
                    None => Reply::Array(vec![]),
                    Some(Data::ZSet(z)) => {
                        let sorted = by_score(z);
                        let mut out = Vec::new();
                        for i in range(sorted.len(), s, e) {
                            out.push(Reply::Bulk(sorted[i].1.clone()));
                            if withscores {
                                out.push(Reply::Bulk(fmt_double(sorted[i].0 .0)));
                            }
                        }
                        Reply::Array(out)
                    }
                    Some(_) => err(WRONGTYPE),
                }
            }
            "ZREMRANGEBYSCORE" => {
                need!(3, 3);
                let (Some((min, minx)), Some((max, maxx))) = (score_bound(&a[1]), score_bound(&a[2]))
                else {
                    return err("ERR min or max is not a float");
                };
                let n = match self.get(&a[0], now) {
                    None => return Reply::Int(0),
                    Some(Data::ZSet(_)) => {
                        let Some(Data::ZSet(z)) = self.keys.get_mut(&a[0]).map(|e| &mut e.data)
                        else {
                            unreachable!()
                        };
                        let before = z.len();
                        z.retain(|_, s| {
                            let above = if minx { s.0 > min } else { s.0 >= min };
                            let below = if maxx { s.0 < max } else { s.0 <= max };
                            !(above && below)
                        });
                        before - z.len()
                    }
                    Some(_) => return err(WRONGTYPE),
                };
                self.drop_if_empty(&a[0]);
                Reply::Int(n as i64)
            }
            "PUBLISH" | "SPUBLISH" => {
                need!(2, 2);
                published.push((a[0].clone(), a[1].clone()));
                Reply::Int(subscribers(&a[0]))
            }
            other => panic!(
                "lock-model: the scripts call `{other}`, which the model's keyspace does not shim yet"
            ),
        }
    }

    fn set(&mut self, now: u64, a: &[String]) -> Reply {
        let (key, value) = (&a[0], &a[1]);
        let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
        let mut ttl: Option<i64> = None;
        let mut i = 2;
        while i < a.len() {
            let o = a[i].to_ascii_uppercase();
            match o.as_str() {
                "NX" if !xx => nx = true,
                "XX" if !nx => xx = true,
                "GET" => get = true,
                "KEEPTTL" if ttl.is_none() => keepttl = true,
                "PX" | "EX" | "PXAT" | "EXAT" if !keepttl && ttl.is_none() => {
                    let Some(v) = a.get(i + 1) else {
                        return err(SYNTAX);
                    };
                    let Some(n) = int(v) else {
                        return err(NOT_INT);
                    };
                    if n <= 0 {
                        return err("ERR invalid expire time in 'set' command");
                    }
                    ttl = Some(match o.as_str() {
                        "PX" => now as i64 + n,
                        "EX" => now as i64 + n * 1000,
                        "PXAT" => n,
                        _ => n * 1000,
                    });
                    i += 1;
                }
                _ => return err(SYNTAX),
            }
            i += 1;
        }
        let old = match self.live(key, now).map(|e| &e.data) {
            None => None,
            Some(Data::Str(s)) => Some(s.clone()),
            Some(_) if get => return err(WRONGTYPE),
            Some(_) => Some(String::new()),
        };
        let exists = self.live(key, now).is_some();
        let answer = |done: bool| -> Reply {
            if get {
                old.clone().map_or(Reply::Nil, Reply::Bulk)
            } else if done {
                ok()
            } else {
                Reply::Nil
            }
        };
        if (nx && exists) || (xx && !exists) {
            return answer(false);
        }
        let expires = match ttl {
            Some(t) => Some(t as u64),
            None if keepttl => self.live(key, now).and_then(|e| e.expires),
            None => None,
        };
        self.keys.insert(
            key.clone(),
            Entry {
                data: Data::Str(value.clone()),
                expires,
            },
        );
        if expires.is_some_and(|t| t < now) {
            self.keys.remove(key);
        }
        answer(true)
    }

    fn zadd(&mut self, now: u64, a: &[String]) -> Reply {
        if a.len() < 3 {
            return err(ARITY);
        }
        let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
            (false, false, false, false, false, false);
        let mut i = 1;
        while i < a.len() {
            match a[i].to_ascii_uppercase().as_str() {
                "NX" => nx = true,
                "XX" => xx = true,
                "GT" => gt = true,
                "LT" => lt = true,
                "CH" => ch = true,
                "INCR" => incr = true,
                _ => break,
            }
            i += 1;
        }
        let pairs = &a[i..];
        if pairs.is_empty() || pairs.len() % 2 == 1 {
            return err(SYNTAX);
        }
        if nx && xx {
            return err("ERR XX and NX options at the same time are not compatible");
        }
        if ((gt || lt) && nx) || (gt && lt) {
            return err("ERR GT, LT, and/or NX options at the same time are not compatible");
        }
        if incr && pairs.len() > 2 {
            return err("ERR INCR option supports a single increment-element pair");
        }
        let mut scores = Vec::new();
        for p in pairs.chunks(2) {
            match float(&p[0]) {
                Some(s) => scores.push((s, p[1].clone())),
                None => return err(NOT_FLOAT),
            }
        }
        let z = match self.live_mut(&a[0], now) {
            None if xx => return if incr { Reply::Nil } else { Reply::Int(0) },
            None => {
                self.keys.insert(
                    a[0].clone(),
                    Entry {
                        data: Data::ZSet(BTreeMap::new()),
                        expires: None,
                    },
                );
                let Data::ZSet(z) = &mut self.keys.get_mut(&a[0]).unwrap().data else {
                    unreachable!()
                };
                z
            }
            Some(Entry {
                data: Data::ZSet(z),
                ..
            }) => z,
            Some(_) => return err(WRONGTYPE),
        };
        let (mut added, mut changed) = (0, 0);
        let mut last = None;
        for (s, m) in scores {
            match z.get(&m).copied() {
                None => {
                    if xx {
                        continue;
                    }
                    z.insert(m, Score(s));
                    added += 1;
                    last = Some(s);
                }
                Some(cur) => {
                    if nx {
                        continue;
                    }
                    let new = if incr { cur.0 + s } else { s };
                    if (gt && new <= cur.0) || (lt && new >= cur.0) {
                        continue;
                    }
                    if new != cur.0 {
                        z.insert(m, Score(new));
                        changed += 1;
                    }
                    last = Some(new);
                }
            }
        }
        self.drop_if_empty(&a[0]);
        if incr {
            return last.map_or(Reply::Nil, |s| Reply::Bulk(fmt_double(s)));
        }
        Reply::Int(if ch { added + changed } else { added })
    }

    fn hash_mut(
        &mut self,
        key: &str,
        now: u64,
        create: bool,
    ) -> Result<Option<&mut Fields>, Reply> {
        if self.live_mut(key, now).is_none() {
            if !create {
                return Ok(None);
            }
            self.keys.insert(
                key.to_string(),
                Entry {
                    data: Data::Hash(Fields::default()),
                    expires: None,
                },
            );
        }
        match &mut self.keys.get_mut(key).unwrap().data {
            Data::Hash(h) => Ok(Some(h)),
            _ => Err(err(WRONGTYPE)),
        }
    }

    fn list_mut(
        &mut self,
        key: &str,
        now: u64,
        create: bool,
    ) -> Result<Option<&mut Vec<String>>, Reply> {
        if self.live_mut(key, now).is_none() {
            if !create {
                return Ok(None);
            }
            self.keys.insert(
                key.to_string(),
                Entry {
                    data: Data::List(Vec::new()),
                    expires: None,
                },
            );
        }
        match &mut self.keys.get_mut(key).unwrap().data {
            Data::List(l) => Ok(Some(l)),
            _ => Err(err(WRONGTYPE)),
        }
    }
}

/// The members of a sorted set in Redis's order: by score, then member.
fn by_score(z: &BTreeMap<String, Score>) -> Vec<(Score, String)> {
    let mut v: Vec<(Score, String)> = z.iter().map(|(m, s)| (*s, m.clone())).collect();
    v.sort();
    v
}

/// Redis's start/stop index range over `len` items.
fn range(len: usize, start: i64, stop: i64) -> std::ops::Range<usize> {
    let len = len as i64;
    let mut s = if start < 0 { len + start } else { start };
    let mut e = if stop < 0 { len + stop } else { stop };
    if s < 0 {
        s = 0;
    }
    if e >= len {
        e = len - 1;
    }
    if s > e || s >= len {
        return 0..0;
    }
    if e < 0 {
        e = -1;
    }
    s as usize..(e + 1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_are_written_as_redis_writes_them() {
        assert_eq!(fmt_g17(0.1), "0.10000000000000001");
        assert_eq!(fmt_g17(1_700_000_000_123.0), "1700000000123");
        assert_eq!(fmt_g17(3.0), "3");
        assert_eq!(fmt_g17(1e300), "1.0000000000000001e+300");
        assert_eq!(fmt_double(f64::INFINITY), "inf");
    }
}
