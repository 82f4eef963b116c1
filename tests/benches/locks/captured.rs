//! The command our client sends to take a free lock, captured with
//! `MONITOR` and replayed on fresh keys: the floor of cases 1 and 3 is
//! exactly what the runtime sends, whatever its scripts' arguments are.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use lock_runtime::LockClient;

use crate::monitor::{end_marker, parse_line, start_marker};

/// A key name no case uses, replaced by the key of each replay.
const PROBE: &str = "lockbench-probe";

#[derive(Clone, Debug)]
pub struct Captured {
    /// The command and its arguments, with `PROBE` where the key was.
    args: Vec<String>,
}

impl Captured {
    /// What our client sends for `lock(PROBE)` on a free key, after a first
    /// lock + unlock that loads its scripts.
    pub fn acquire(
        rt: &tokio::runtime::Runtime,
        client: &LockClient,
        port: u16,
    ) -> Result<Captured, String> {
        let once = |key: String| {
            rt.block_on(async {
                let guard = client.lock(key).await.map_err(|e| e.to_string())?;
                guard.release().await.map_err(|e| e.to_string())
            })
        };
        once(format!("{PROBE}-warm"))?;
        let id = format!("capture-{}", std::process::id());
        let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"MONITOR\r\n")
            .map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        if !line.starts_with("+OK") {
            return Err(format!("MONITOR refused: {line}"));
        }
        let mut admin = crate::servers::conn(port);
        let echo = |admin: &mut redis::Connection, s: String| {
            redis::cmd("ECHO")
                .arg(s)
                .query::<String>(admin)
                .map_err(|e| e.to_string())
        };
        echo(&mut admin, start_marker(&id))?;
        once(PROBE.to_owned())?;
        echo(&mut admin, end_marker(&id))?;
        let (start, end) = (start_marker(&id), end_marker(&id));
        let mut counting = false;
        loop {
            line.clear();
            if reader.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err("MONITOR closed".into());
            }
            let Some(l) = parse_line(&line) else { continue };
            if l.args.contains(&start) {
                counting = true;
                continue;
            }
            if !counting || l.in_script {
                continue;
            }
            if l.args.contains(&end) {
                return Err("no command named the probe key".into());
            }
            if l.args.iter().any(|a| a.contains(PROBE)) {
                let args = l.args.iter().map(|a| a.replace(PROBE, "\u{0}")).collect();
                return Ok(Captured { args });
            }
        }
    }

    /// The command's name, upper case (`EVALSHA`).
    pub fn name(&self) -> String {
        self.args[0].to_uppercase()
    }

    /// The arguments for `key`.
    pub fn args_for(&self, key: &str) -> Vec<String> {
        self.args.iter().map(|a| a.replace('\u{0}', key)).collect()
    }

    /// The command for `key`.
    pub fn cmd_for(&self, key: &str) -> redis::Cmd {
        let args = self.args_for(key);
        let mut cmd = redis::cmd(&args[0]);
        for a in &args[1..] {
            cmd.arg(a);
        }
        cmd
    }

    /// Whether a reply to it took the lock: `OK`, or a script's `{1, …}`.
    pub fn took(reply: &redis::Value) -> bool {
        use redis::Value;
        match reply {
            Value::Okay => true,
            Value::SimpleString(s) => s == "OK",
            Value::Int(1) => true,
            Value::Array(v) => matches!(v.first(), Some(Value::Int(1))),
            _ => false,
        }
    }
}
