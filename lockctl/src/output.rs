//! What `lockctl` prints: aligned text for people, one JSON object a line
//! for scripts.

use std::io::Write;
use std::time::Duration;

use lock_runtime::{LockInfo, LockMode};
use serde_json::{json, Value};

pub(crate) struct Output {
    json: bool,
}

/// A semaphore's size; `None` for a lock.
fn permits(info: &LockInfo) -> Option<u32> {
    match info.mode {
        LockMode::Semaphore { permits } => Some(permits),
        _ => None,
    }
}

/// A lock as one JSON object: `mode` is `read`, `write` or `semaphore`
/// (then `permits` is its size; `null` for a lock).
fn object(info: &LockInfo) -> Value {
    let mode = match info.mode {
        LockMode::Semaphore { .. } => "semaphore".to_owned(),
        other => other.to_string(),
    };
    json!({
        "key": info.key,
        "mode": mode,
        "permits": permits(info),
        "holders": info.holders,
        "ttl_ms": info.ttl.map(|t| t.as_millis() as u64),
        "waiters": info.waiters,
        "fence": info.fence,
    })
}

fn ttl(t: Option<Duration>) -> String {
    t.map_or_else(|| "-".into(), |t| format!("{:.3}s", t.as_secs_f64()))
}

fn holders(info: &LockInfo) -> String {
    if info.holders.is_empty() {
        "-".into()
    } else {
        info.holders.join(",")
    }
}

fn fence(info: &LockInfo) -> String {
    info.fence.map_or_else(|| "-".into(), |f| f.to_string())
}

/// Print `lines`; a reader that went away (`lockctl list | head`) just
/// ends the output.
fn print(lines: impl IntoIterator<Item = String>) {
    let mut out = std::io::stdout().lock();
    for line in lines {
        if writeln!(out, "{line}").is_err() {
            return;
        }
    }
    let _ = out.flush();
}

impl Output {
    pub(crate) fn new(json: bool) -> Self {
        Output { json }
    }

    /// One line per lock; text gets a header and aligned columns.
    pub(crate) fn list(&self, locks: &[LockInfo]) {
        if self.json {
            print(locks.iter().map(|l| object(l).to_string()));
            return;
        }
        if locks.is_empty() {
            print(["no lock held or awaited".to_owned()]);
            return;
        }
        let header = ["KEY", "MODE", "HOLDERS", "TTL", "WAITERS", "FENCE"].map(String::from);
        let rows: Vec<[String; 6]> = std::iter::once(header)
            .chain(locks.iter().map(|l| {
                [
                    l.key.clone(),
                    l.mode.to_string(),
                    holders(l),
                    ttl(l.ttl),
                    l.waiters.to_string(),
                    fence(l),
                ]
            }))
            .collect();
        let mut width = [0; 6];
        for row in &rows {
            for (w, cell) in width.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        print(rows.iter().map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(width)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            cells.join("  ").trim_end().to_owned()
        }));
    }

    pub(crate) fn show(&self, info: &LockInfo) {
        if self.json {
            print([object(info).to_string()]);
            return;
        }
        let mode = match permits(info) {
            Some(n) => format!(
                "semaphore, {} of {n} permit{} held",
                info.holders.len(),
                if n == 1 { "" } else { "s" }
            ),
            None => info.mode.to_string(),
        };
        // One holder a line: a semaphore's (or readers') can be many.
        let mut holders = info.holders.iter();
        let first = holders.next().map_or("-", String::as_str);
        let mut lines = vec![
            format!("key      {}", info.key),
            format!("mode     {mode}"),
            format!("holders  {first}"),
        ];
        lines.extend(holders.map(|h| format!("         {h}")));
        lines.extend([
            format!("ttl      {}", ttl(info.ttl)),
            format!("waiters  {}", info.waiters),
            format!("fence    {}", fence(info)),
        ]);
        print(lines);
    }

    /// `show` of a key nobody holds or waits for: text says so, JSON
    /// prints nothing (the exit status tells).
    pub(crate) fn free(&self, key: &str) {
        if !self.json {
            print([format!("{key}: not held, nobody waits")]);
        }
    }

    /// The outcome of `release --force` (of `holder`'s hold only, with
    /// `--holder`), with the lock before and after.
    pub(crate) fn released(
        &self,
        key: &str,
        holder: Option<&str>,
        released: bool,
        before: Option<&LockInfo>,
        after: Option<&LockInfo>,
    ) {
        if self.json {
            print([json!({
                "key": key,
                "holder": holder,
                "released": released,
                "before": before.map(object),
                "after": after.map(object),
            })
            .to_string()]);
            return;
        }
        let now = match after {
            Some(a) if !a.holders.is_empty() => {
                format!(
                    "now held by {} ({}, fence {})",
                    holders(a),
                    a.mode,
                    fence(a)
                )
            }
            Some(a) => format!("now free, {} waiting", a.waiters),
            None => "now free".to_owned(),
        };
        let line = match (released, holder, before) {
            (true, Some(h), _) => format!("{key}: released the hold of {h}; {now}"),
            (true, None, Some(b)) if permits(b).is_some() => {
                let n = b.holders.len();
                let s = if n == 1 { "" } else { "s" };
                format!("{key}: released {n} permit{s}, of {}; {now}", holders(b))
            }
            (true, None, Some(b)) => {
                format!("{key}: released the hold of {}; {now}", holders(b))
            }
            (true, None, None) => format!("{key}: released; {now}"),
            (false, Some(h), _) => format!("{key}: {h} does not hold it, nothing released; {now}"),
            (false, None, _) => format!("{key}: not held, nothing released"),
        };
        print([line]);
    }
}
