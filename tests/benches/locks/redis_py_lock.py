#!/usr/bin/env python3
"""redis-py's `Lock` as a contender in the lock benchmarks.

Run by tests/benches/locks.rs (`scripts/bench.sh` installs redis-py with pip).
Measures inside this process with time.perf_counter_ns and prints one JSON
object on stdout. redis-py's own defaults are kept: a blocking acquire polls
with `sleep=0.1` (100 ms) between attempts.

Modes:
  uncontended  one thread, a fresh key per cycle: acquire + release latency
  count        like uncontended, between CONFIG RESETSTAT / ECHO markers, so the
               bench can count round trips with MONITOR and INFO commandstats
  throughput   --tasks threads on distinct keys for --seconds: cycles per second
  handoff      --tasks threads on one key, each holding --hold-ms: time from just
               before a holder calls release to the next holder running, each
               acquisition's wait (asking to holding), and the `INFO
               commandstats` calls over the window (connections opened and the
               release script loaded before it)
"""

import argparse
import json
import sys
import threading
import time

import redis

LEASE_S = 30


def cycle(r, name):
    lock = r.lock(name, timeout=LEASE_S, blocking_timeout=5)
    if not lock.acquire():
        raise RuntimeError(f"could not take uncontended lock {name}")
    lock.release()


def uncontended(r, args):
    for i in range(args.warmup):
        cycle(r, f"{args.tag}:warm:{i}")
    samples = []
    for i in range(args.n):
        name = f"{args.tag}:{i}"
        t0 = time.perf_counter_ns()
        cycle(r, name)
        samples.append(time.perf_counter_ns() - t0)
    return {"samples_ns": samples}


def count(r, args):
    for i in range(args.warmup):
        cycle(r, f"{args.tag}:warm:{i}")
    r.execute_command("CONFIG", "RESETSTAT")
    r.execute_command("ECHO", f"lockbench-start-{args.marker}")
    for i in range(args.n):
        cycle(r, f"{args.tag}:{i}")
    r.execute_command("ECHO", f"lockbench-end-{args.marker}")
    return {"cycles": args.n}


def throughput(r, args):
    stop = threading.Event()
    counts = [0] * args.tasks
    errors = []

    def worker(t):
        k = 0
        try:
            while not stop.is_set():
                cycle(r, f"{args.tag}:{t}:{k}")
                k += 1
                counts[t] += 1
        except Exception as e:  # noqa: BLE001 - reported to the bench
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(args.tasks)]
    for th in threads:
        th.start()
    time.sleep(args.warmup_seconds)
    c0, t0 = sum(counts), time.perf_counter_ns()
    time.sleep(args.seconds)
    c1, t1 = sum(counts), time.perf_counter_ns()
    stop.set()
    for th in threads:
        th.join()
    return {"ops": c1 - c0, "seconds": (t1 - t0) / 1e9, "errors": errors[:3]}


def commandstats(r):
    """`calls` per command in INFO commandstats: {"evalsha": 12, ...}."""
    out = {}
    for k, v in r.info("commandstats").items():
        if k.startswith("cmdstat_") and isinstance(v, dict) and "calls" in v:
            out[k[len("cmdstat_"):]] = int(v["calls"])
    return out


def warm_pool(r, n):
    """Open `n` pooled connections now, so that connecting stays out of the
    counted window."""
    pool = r.connection_pool
    conns = []
    for _ in range(n):
        try:
            conns.append(pool.get_connection())
        except TypeError:  # redis-py < 6 wants a command name
            conns.append(pool.get_connection("PING"))
    for c in conns:
        c.connect()
        pool.release(c)


def handoff(r, args):
    key = f"{args.tag}:handoff"
    cond = threading.Condition()
    state = {"gen": 0, "released_at": None}
    samples = []
    holds = []
    waits = []
    errors = []
    warm_pool(r, args.tasks)
    cycle(r, f"{args.tag}:warm")  # loads the release script
    stats_before = commandstats(r)
    deadline = time.perf_counter_ns() + int(args.seconds * 1e9)

    def worker():
        try:
            while time.perf_counter_ns() < deadline:
                asked = time.perf_counter_ns()
                lock = r.lock(key, timeout=LEASE_S, blocking_timeout=60)
                if not lock.acquire():
                    raise RuntimeError("waited 60 s for the lock")
                started = time.perf_counter_ns()
                with cond:
                    if state["released_at"] is not None:
                        samples.append(started - state["released_at"])
                    waits.append(started - asked)
                    state["gen"] += 1
                    mine = state["gen"]
                    cond.notify_all()  # the threads that released may ask again
                time.sleep(args.hold_ms / 1000)
                with cond:
                    state["released_at"] = time.perf_counter_ns()
                    holds.append(state["released_at"] - started)
                lock.release()
                # Back of the queue: ask again once someone else has had it.
                with cond:
                    while state["gen"] == mine and time.perf_counter_ns() < deadline:
                        cond.wait(0.05)
        except Exception as e:  # noqa: BLE001 - reported to the bench
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.tasks)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stats_after = commandstats(r)
    return {
        "samples_ns": samples,
        "holds_ns": holds,
        "waits_ns": waits,
        "commandstats_before": stats_before,
        "commandstats_after": stats_after,
        "errors": errors[:3],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", required=True, choices=["uncontended", "count", "throughput", "handoff"])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup-seconds", type=float, default=0.5)
    ap.add_argument("--hold-ms", type=float, default=1.0)
    ap.add_argument("--tag", default="py")
    ap.add_argument("--marker", default="")
    args = ap.parse_args()

    r = redis.Redis(host="127.0.0.1", port=args.port, max_connections=max(args.tasks, 1) + 4)
    r.ping()
    out = {"mode": args.mode, "redis_py": redis.__version__, "python": sys.version.split()[0]}
    out.update({"uncontended": uncontended, "count": count, "throughput": throughput, "handoff": handoff}[args.mode](r, args))
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
