//! What each command costs the server: `calls` and `usec` per command in
//! `INFO commandstats`, and the difference of two readings.
//!
//! A script's `usec` includes the commands it runs, which are also counted
//! under their own names (`cmdstat_set` counts a client's `SET` and a
//! script's alike).

use std::collections::BTreeMap;

use crate::monitor::SCRIPT_COMMANDS;

#[derive(Debug, Default, Clone, Copy)]
pub struct Cost {
    pub calls: u64,
    pub usec: u64,
}

#[derive(Debug, Default, Clone)]
pub struct CommandCosts(pub BTreeMap<String, Cost>);

/// Commands the measuring itself sends.
fn is_measurement(name: &str) -> bool {
    name == "info" || name == "echo" || name.starts_with("config|") || name.starts_with("client|")
}

impl CommandCosts {
    pub fn read(conn: &mut redis::Connection) -> CommandCosts {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .unwrap_or_default();
        CommandCosts(
            info.lines()
                .filter_map(|l| l.strip_prefix("cmdstat_"))
                .filter_map(|l| {
                    // set:calls=1,usec=2,usec_per_call=2.00,…
                    let (name, rest) = l.split_once(':')?;
                    let field = |f: &str| {
                        rest.split(',')
                            .find_map(|kv| kv.strip_prefix(f))
                            .and_then(|v| v.parse::<u64>().ok())
                    };
                    Some((
                        name.to_owned(),
                        Cost {
                            calls: field("calls=")?,
                            usec: field("usec=")?,
                        },
                    ))
                })
                .collect(),
        )
    }

    /// What ran between `before` and this reading, less the measuring's own
    /// commands.
    pub fn since(&self, before: &CommandCosts) -> CommandCosts {
        CommandCosts(
            self.0
                .iter()
                .filter(|(k, _)| !is_measurement(k))
                .map(|(k, c)| {
                    let b = before.0.get(k).copied().unwrap_or_default();
                    (
                        k.clone(),
                        Cost {
                            calls: c.calls.saturating_sub(b.calls),
                            usec: c.usec.saturating_sub(b.usec),
                        },
                    )
                })
                .filter(|(_, c)| c.calls > 0)
                .collect(),
        )
    }

    /// `evalsha 2.00 × 5.1 µs · time 1.00 × 0.4 µs`: calls per cycle and
    /// µs per call, scripts first, then by calls; commands run less than
    /// once per 200 cycles (other clients' background work) left out.
    pub fn per_cycle(&self, cycles: u64) -> String {
        if cycles == 0 || self.0.is_empty() {
            return "n/a".into();
        }
        let mut v: Vec<(&String, &Cost)> = self
            .0
            .iter()
            .filter(|(_, c)| c.calls as f64 / cycles as f64 >= 0.005)
            .collect();
        v.sort_by_key(|(k, c)| (!SCRIPT_COMMANDS.contains(&k.as_str()), u64::MAX - c.calls));
        v.iter()
            .map(|(k, c)| {
                format!(
                    "{} {:.2} × {:.1} µs",
                    k.to_uppercase(),
                    c.calls as f64 / cycles as f64,
                    c.usec as f64 / c.calls.max(1) as f64
                )
            })
            .collect::<Vec<_>>()
            .join(" · ")
    }
}
