//! Case 11: what each lock and permit script costs the server per call,
//! next to hand-written minimal scripts running only the commands it needs
//! (the floor) and rslock's: `scripts/profile-scripts.sh` on the main server and
//! on the other kind, under callgrind where valgrind is installed
//! (instructions per call repeat on a loaded machine; CPU time does not).

use std::process::Command;

use crate::report::Report;
use crate::servers;
use crate::Ctx;

pub fn run(ctx: &Ctx, report: &mut Report) {
    let callgrind = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let calls = match (callgrind, ctx.quick) {
        (true, true) => "500",
        (true, false) => "2000",
        (false, true) => "5000",
        (false, false) => "50000",
    };
    report.heading("Case 11 — each script per call: ours, the floor, rslock");
    report.para(&format!(
        "`scripts/profile-scripts.sh`: the exact `EVALSHA` (or command) the client sends for each operation, \
         {calls} of them on fresh keys through one pipelined connection (`redis-cli --pipe`), on a server \
         started for it, against hand-written minimal scripts doing only the commands the operation needs \
         (the floor: a fenced acquire of a free lock is `TIME`, the counter's `SET … GET`, `SET NX PX` of \
         \"<owner> <token>\"; a release of an unmarked hold is `GET`, compare, `DEL`; a fenced permit of a \
         free semaphore nobody waits for is `HLEN`, `TIME`, `LLEN`, the counter's `SET … GET`, `HSET`, \
         `PEXPIRE`; its release is `TIME`, `HGET`, `HDEL`, `LLEN`) and rslock's. Server \
         CPU per call: `INFO cpu` over the calls. {} `INFO commandstats` µs per call are wall-clock \
         inside the server, so on a loaded machine they include the time the server was not scheduled; \
         read the CPU and instruction columns.",
        if callgrind {
            "Instructions per call: the server runs under `valgrind --tool=callgrind`, counting every \
             user-space instruction it ran over the calls (reading, parsing, running, replying), which \
             repeats within a fraction of a percent on a loaded machine; CPU figures are then valgrind's \
             (about 30 × slower), comparable only with each other."
        } else {
            "(valgrind is not installed: no instruction counts.)"
        }
    ));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/profile-scripts.sh");
    for binary in [tests::server_binary(), servers::other_binary().to_owned()] {
        let mut cmd = Command::new(script);
        cmd.arg(&binary);
        if callgrind {
            cmd.arg("--callgrind");
        }
        cmd.arg(calls);
        match cmd.output() {
            Ok(out) if out.status.success() => {
                report.para(String::from_utf8_lossy(&out.stdout).trim())
            }
            Ok(out) => report.para(&format!(
                "{binary}: `scripts/profile-scripts.sh` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => report.para(&format!("{binary}: could not run `{script}`: {e}")),
        }
    }
}
