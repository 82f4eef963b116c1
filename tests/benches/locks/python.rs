//! The redis-py contender: `redis_py_lock.py`, run as a child process.

use std::process::Command;

use serde_json::Value;

use crate::stats::Samples;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/benches/locks/redis_py_lock.py"
);

pub struct Python {
    exe: String,
    /// `redis-py 8.1.0 on Python 3.11.7`.
    pub describe: String,
}

impl Python {
    /// `$PYTHON` or `python3`, if it can import redis-py.
    pub fn detect() -> Option<Python> {
        let exe = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let out = Command::new(&exe)
            .args([
                "-c",
                "import redis, sys; print(redis.__version__, sys.version.split()[0])",
            ])
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "redis-py contender skipped: `{exe} -c 'import redis'` failed (scripts/bench.sh installs it with pip)"
            );
            return None;
        }
        let v = String::from_utf8_lossy(&out.stdout);
        let mut it = v.split_whitespace();
        let (rp, py) = (it.next().unwrap_or("?"), it.next().unwrap_or("?"));
        Some(Python {
            exe,
            describe: format!("redis-py {rp} on Python {py}"),
        })
    }

    /// Run the script in `mode` with extra `--flag value` pairs.
    pub fn run(&self, port: u16, mode: &str, args: &[(&str, String)]) -> Result<Value, String> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg(SCRIPT)
            .args(["--port", &port.to_string(), "--mode", mode]);
        for (k, v) in args {
            cmd.arg(format!("--{k}")).arg(v);
        }
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.exe))?;
        if !out.status.success() {
            return Err(format!(
                "redis_py_lock.py --mode {mode} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let v: Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("redis_py_lock.py printed bad JSON: {e}"))?;
        if let Some(errs) = v
            .get("errors")
            .and_then(Value::as_array)
            .filter(|e| !e.is_empty())
        {
            return Err(format!(
                "redis_py_lock.py --mode {mode} reported errors: {errs:?}"
            ));
        }
        Ok(v)
    }
}

pub fn samples(v: &Value, field: &str) -> Samples {
    let arr = v
        .get(field)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut s = Samples::with_capacity(arr.len());
    for x in arr {
        if let Some(ns) = x.as_u64() {
            s.push_ns(ns);
        }
    }
    s
}
