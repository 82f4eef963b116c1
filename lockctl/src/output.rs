//! What `lockctl` prints: aligned text for people, one JSON object a line
//! for scripts.

use std::io::Write;
use std::time::Duration;

use lock_runtime::LockInfo;
use serde_json::{json, Value};

pub(crate) struct Output {
    json: bool,
}

/// A lock as one JSON object.
fn object(info: &LockInfo) -> Value {
    json!({
        "key": info.key,
        "mode": info.mode.to_string(),
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
        print([
            format!("key      {}", info.key),
            format!("mode     {}", info.mode),
            format!("holders  {}", holders(info)),
            format!("ttl      {}", ttl(info.ttl)),
            format!("waiters  {}", info.waiters),
            format!("fence    {}", fence(info)),
        ]);
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
