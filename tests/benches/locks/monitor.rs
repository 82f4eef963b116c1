//! Counting Redis round trips.
//!
//! `INFO commandstats` counts every command Redis runs, including the ones a
//! Lua script issues (`EVALSHA` of our acquire script shows up as `evalsha`
//! plus `exists`, `hset`, `pexpire` and `incr`). A round trip is a command a
//! client sent, so the count is taken from `MONITOR`, which tags commands run
//! by scripts as `[.. lua]`, between two `ECHO` markers; the `commandstats`
//! total over the same window is reported beside it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Commands clients sent, by name (lower case), markers excluded.
    pub sent: BTreeMap<String, u64>,
    /// Commands run from inside scripts.
    pub in_scripts: u64,
}

/// Round trips per cycle, measured over `n` cycles.
#[derive(Debug, Clone)]
pub struct RoundTrips {
    pub n: u64,
    pub counts: Counts,
    /// Sum of `calls` in `INFO commandstats` over the window (markers
    /// excluded): every command Redis ran, including inside scripts.
    pub commandstats: u64,
}

impl RoundTrips {
    pub fn per_cycle(&self) -> f64 {
        self.counts.sent.values().sum::<u64>() as f64 / self.n as f64
    }

    /// `EVALSHA 2.00` / `SET 1.00 + EVALSHA 1.00`.
    pub fn breakdown(&self) -> String {
        self.counts
            .sent
            .iter()
            .map(|(k, v)| format!("{} {:.2}", k.to_uppercase(), *v as f64 / self.n as f64))
            .collect::<Vec<_>>()
            .join(" + ")
    }

    pub fn commands_per_cycle(&self) -> f64 {
        self.commandstats as f64 / self.n as f64
    }

    /// Whether MONITOR and commandstats agree on the window.
    pub fn consistent(&self) -> bool {
        self.counts.sent.values().sum::<u64>() + self.counts.in_scripts == self.commandstats
    }
}

pub struct Monitor {
    thread: JoinHandle<std::io::Result<Counts>>,
}

pub fn start_marker(id: &str) -> String {
    format!("lockbench-start-{id}")
}

pub fn end_marker(id: &str) -> String {
    format!("lockbench-end-{id}")
}

impl Monitor {
    /// Listen to everything the server runs; count between the markers of `id`.
    pub fn start(port: u16, id: &str) -> std::io::Result<Monitor> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        stream.write_all(b"MONITOR\r\n")?;
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok)?;
        if !ok.starts_with("+OK") {
            return Err(std::io::Error::other(format!("MONITOR refused: {ok}")));
        }
        let start = format!("\"{}\"", start_marker(id));
        let end = format!("\"{}\"", end_marker(id));
        let thread = std::thread::spawn(move || {
            let mut counts = Counts::default();
            let mut counting = false;
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 {
                    return Err(std::io::Error::other("MONITOR connection closed"));
                }
                if !counting {
                    counting = line.contains(&start);
                    continue;
                }
                if line.contains(&end) {
                    return Ok(counts);
                }
                // +1700000000.123456 [0 127.0.0.1:5555] "evalsha" "…" …
                let Some((source, rest)) = line.split_once(']') else {
                    continue;
                };
                if source.ends_with("lua") {
                    counts.in_scripts += 1;
                } else if let Some(name) = rest.split('"').nth(1) {
                    *counts.sent.entry(name.to_lowercase()).or_default() += 1;
                }
            }
        });
        Ok(Monitor { thread })
    }

    pub fn finish(self) -> std::io::Result<Counts> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("monitor thread panicked")))
    }
}

/// Top-level script commands: what a client sends to run a script.
pub const SCRIPT_COMMANDS: &[&str] = &[
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// `calls` per command in `INFO commandstats` (`evalsha`, `config|resetstat`),
/// or the difference of two readings.
#[derive(Debug, Default, Clone)]
pub struct CommandStats(pub BTreeMap<String, u64>);

impl CommandStats {
    /// One `INFO commandstats` reading.
    pub fn read(conn: &mut redis::Connection) -> CommandStats {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .unwrap_or_default();
        CommandStats(
            info.lines()
                .filter_map(|l| l.strip_prefix("cmdstat_"))
                .filter_map(|l| {
                    let (name, rest) = l.split_once(":calls=")?;
                    let calls = rest.split(',').next()?.parse::<u64>().ok()?;
                    Some((name.to_owned(), calls))
                })
                .collect(),
        )
    }

    /// A reading the Python contender took itself: `{"evalsha": 12, …}`.
    pub fn from_json(v: Option<&serde_json::Value>) -> Option<CommandStats> {
        let map = v?.as_object()?;
        Some(CommandStats(
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect(),
        ))
    }

    /// What ran between `before` and this reading.
    pub fn since(&self, before: &CommandStats) -> CommandStats {
        CommandStats(
            self.0
                .iter()
                .map(|(k, &v)| (k.clone(), v.saturating_sub(before.get(k))))
                .filter(|&(_, v)| v > 0)
                .collect(),
        )
    }

    pub fn get(&self, command: &str) -> u64 {
        self.0.get(command).copied().unwrap_or(0)
    }

    /// Top-level script calls (`EVALSHA`, `EVAL`, …).
    pub fn scripts(&self) -> u64 {
        SCRIPT_COMMANDS.iter().map(|c| self.get(c)).sum()
    }

    /// Every command Redis ran, including the ones scripts run, leaving out
    /// the commands the counting itself sends (`INFO`, `CONFIG RESETSTAT`,
    /// the `ECHO` markers).
    pub fn total(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| !k.starts_with("config|") && *k != "echo" && *k != "info")
            .map(|(_, v)| v)
            .sum()
    }
}

/// Sum of `calls` in `INFO commandstats`, leaving out the commands the
/// counting itself sends (`CONFIG RESETSTAT`, the `ECHO` markers).
pub fn commandstats_total(conn: &mut redis::Connection) -> u64 {
    CommandStats::read(conn).total()
}

/// Calls of one command in `INFO commandstats` (`evalsha`, `pexpire`).
pub fn commandstats_calls(conn: &mut redis::Connection, command: &str) -> u64 {
    CommandStats::read(conn).get(command)
}

pub fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(conn)
        .expect("CONFIG RESETSTAT");
}

fn echo(conn: &mut redis::Connection, s: &str) {
    let _: String = redis::cmd("ECHO").arg(s).query(conn).expect("ECHO");
}

/// Count the round trips of `n` cycles that `run` performs. With
/// `external`, `run` gets the marker id and sends `CONFIG RESETSTAT` and the
/// markers itself (the Python contender does); otherwise they are sent here.
pub fn count(
    conn: &mut redis::Connection,
    port: u16,
    n: u64,
    external: bool,
    run: impl FnOnce(&str) -> Result<(), String>,
) -> Result<RoundTrips, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let monitor = Monitor::start(port, &id).map_err(|e| e.to_string())?;
    if !external {
        reset_stats(conn);
        echo(conn, &start_marker(&id));
    }
    let ran = run(&id);
    if !external || ran.is_err() {
        echo(conn, &end_marker(&id));
    }
    ran?;
    let counts = monitor.finish().map_err(|e| e.to_string())?;
    let commandstats = commandstats_total(conn);
    Ok(RoundTrips {
        n,
        counts,
        commandstats,
    })
}

/// One `MONITOR` line: `+1700000000.123456 [0 127.0.0.1:5555] "set" "k" "v"`.
pub struct Line {
    /// When the server ran it, in ns since the Unix epoch (its clock, µs).
    pub at_ns: u64,
    /// Run by a script (`[0 lua]`).
    pub in_script: bool,
    /// The command and its arguments, unquoted.
    pub args: Vec<String>,
}

/// Parse a `MONITOR` line (arguments are quoted as `sdscatrepr` quotes them).
pub fn parse_line(line: &str) -> Option<Line> {
    let line = line.trim_end().strip_prefix('+')?;
    let (ts, rest) = line.split_once(' ')?;
    let (secs, micros) = ts.split_once('.')?;
    let at_ns = secs.parse::<u64>().ok()? * 1_000_000_000 + micros.parse::<u64>().ok()? * 1000;
    let (source, rest) = rest.split_once("] ")?;
    let mut args = Vec::new();
    let mut chars = rest.chars();
    loop {
        match chars.next() {
            None => break,
            Some(' ') => continue,
            Some('"') => {}
            Some(_) => return None,
        }
        let mut arg = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => arg.push('\n'),
                    'r' => arg.push('\r'),
                    't' => arg.push('\t'),
                    'a' => arg.push('\x07'),
                    'b' => arg.push('\x08'),
                    'x' => {
                        let hex: String = [chars.next()?, chars.next()?].iter().collect();
                        arg.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                    }
                    c => arg.push(c),
                },
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    Some(Line {
        at_ns,
        in_script: source.ends_with("lua"),
        args,
    })
}
