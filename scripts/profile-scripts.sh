#!/usr/bin/env bash
# What each lock script costs the server per call, next to hand-written
# minimal scripts doing only the commands it needs (the floor) and rslock's
# release: the exact EVALSHA the client sends, pipelined (`redis-cli
# --pipe`), on a server this script starts. Prints, per case, µs per call
# (`INFO commandstats` usec_per_call of the command measured) and server CPU
# per call (`INFO cpu`); with `--callgrind`, the server runs under
# `valgrind --tool=callgrind` and the figure is its instructions per call
# (user space, everything the server did in the window: reading, parsing,
# running, replying), repeatable on a loaded machine.
#
#   scripts/profile-scripts.sh                       # redis-server, 100 000 calls a case
#   scripts/profile-scripts.sh valkey-server         # the same on Valkey
#   scripts/profile-scripts.sh redis-server --callgrind [calls]   # instructions per call
#   PROFILE_CASES=acquire,floor-acquire scripts/profile-scripts.sh   # some cases only
#   PROFILE_KEEP=dir scripts/profile-scripts.sh redis-server --callgrind  # keep the dumps
#
# The scripts are read from lock-runtime/scripts/ as they are in the work
# tree, so a change shows here before it is built.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, random, re, socket, subprocess, sys, tempfile, time

args = [a for a in sys.argv[1:]]
callgrind = "--callgrind" in args
args = [a for a in args if a != "--callgrind"]
server = args[0] if args else "redis-server"
calls = int(args[1]) if len(args) > 1 else (3000 if callgrind else 100000)
only = [c for c in os.environ.get("PROFILE_CASES", "").split(",") if c]

def read(path):
    with open(path) as f:
        return f.read()

OURS = {n: read(f"lock-runtime/scripts/{n}.lua")
        for n in ("acquire", "release", "permit", "release_permit")}
# The floor: only the commands the fast path needs, nothing checked.
FLOOR_ACQUIRE = """local t = redis.call('TIME')
local token = t[1] .. string.sub('00000' .. t[2], -6)
redis.call('SET', KEYS[2], token, 'PX', ARGV[3], 'GET')
if redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token, 'NX', 'PX', ARGV[2]) then
  return {1, token}
end
return 0
"""
# The same with the HDEL a queuing attempt runs (the default wait).
FLOOR_ACQUIRE_WAIT = FLOOR_ACQUIRE.replace("  return {1, token}", "  redis.call('HDEL', KEYS[1] .. ':waiters', ARGV[1])\n  return {1, token}")
FLOOR_RELEASE = """if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# A semaphore's floor: a permit of a free semaphore nobody waits for (the
# hash's size, the clock, the queue's length, the counter, the entry, its
# expiry), and its release (the clock, the entry, its deletion, the queue).
FLOOR_PERMIT = """redis.call('HLEN', KEYS[1])
local t = redis.call('TIME')
redis.call('LLEN', KEYS[1] .. ':queue')
local token = t[1] .. string.sub('00000' .. t[2], -6)
redis.call('SET', KEYS[2], token, 'PX', '86400000', 'GET')
redis.call('HSET', KEYS[1], ARGV[1], t[1] .. ' ' .. token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, token}
"""
FLOOR_RELEASE_PERMIT = """redis.call('TIME')
redis.call('HGET', KEYS[1], ARGV[1])
local r = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('LLEN', KEYS[1] .. ':queue')
return r
"""
# rslock 0.10's unlock script, verbatim.
RSLOCK_RELEASE = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
else
  return 0
end
"""

def resp(*parts):
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        p = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p

work = os.environ.get("PROFILE_KEEP") or tempfile.mkdtemp(prefix="profile-scripts-")
os.makedirs(work, exist_ok=True)
port = free_port()
cmd = [server, "--port", str(port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
       "--dir", work]
if callgrind:
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/cg.out"] + cmd
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

def cli(*a):
    return subprocess.run(["redis-cli", "-p", str(port)] + [str(x) for x in a],
                          capture_output=True, text=True).stdout.strip()

for _ in range(600):
    if cli("PING") == "PONG":
        break
    time.sleep(0.1)
else:
    sys.exit(f"{server} did not start")

info = cli("INFO", "server")
version = re.search(r"valkey_version:(\S+)", info) or re.search(r"redis_version:(\S+)", info)
name = f"{'Valkey' if 'valkey' in server else 'Redis'} {version.group(1) if version else '?'}"
native = "DELIFEQ" if "ERR unknown command" not in cli("DELIFEQ", "x", "y") else None

def load(src):
    return cli("SCRIPT", "LOAD", src)

sha = {
    "acquire": load(OURS["acquire"]),
    "release": load(OURS["release"]),
    "floor-acquire": load(FLOOR_ACQUIRE),
    "floor-acquire-wait": load(FLOOR_ACQUIRE_WAIT),
    "floor-release": load(FLOOR_RELEASE),
    "rslock-release": load(RSLOCK_RELEASE),
    "permit": load(OURS["permit"]),
    "release_permit": load(OURS["release_permit"]),
    "floor-permit": load(FLOOR_PERMIT),
    "floor-release-permit": load(FLOOR_RELEASE_PERMIT),
}

CLIENT = "%032x" % random.getrandbits(128)
FENCE_TTL = 86400000
LEASE = 30000
# The default wait's stay (retry delay 1 s + jitter 50 ms + 2 × op_timeout 2 s).
STAY = 5050

def owner(i):
    return f"{CLIENT}:{i}"

def permit_owner(i):
    # A request of a semaphore of 4 permits (`Mode::Permit`).
    return f"{CLIENT}:s4.{i}"

def token(i):
    return str(1764000000000000 + i)

def key(case, i):
    return f"lock:{{p:{case}:{i}}}"

def pipe(data):
    r = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=data, capture_output=True)
    out = r.stdout.decode()
    m = re.search(r"errors: (\d+), replies: (\d+)", out)
    if not m or m.group(1) != "0":
        sys.exit(f"pipe failed: {out} {r.stderr.decode()}")

def commandstats():
    stats = {}
    for line in cli("INFO", "commandstats").splitlines():
        m = re.match(r"cmdstat_([^:]+):calls=(\d+),usec=(\d+)", line)
        if m:
            stats[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return stats

def cpu():
    info = cli("INFO", "cpu")
    f = lambda k: float(re.search(k + r":([\d.]+)", info).group(1))
    return f("used_cpu_user") + f("used_cpu_sys")

dumps = [0]
def callgrind_window(run):
    subprocess.run(["callgrind_control", "-z", str(proc.pid)], capture_output=True)
    run()
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True)
    dumps[0] += 1
    path = f"{work}/cg.out.{dumps[0]}"
    for _ in range(100):
        if os.path.exists(path):
            break
        time.sleep(0.1)
    total = re.search(r"^(?:summary|totals): (\d+)", read(path), re.M)
    return int(total.group(1)), path

# Each case: (name, what it is, setup commands, measured command, the
# commandstats entry it is counted under).
def cases():
    n = range(calls)
    held = lambda c, v: b"".join(resp("SET", key(c, i), v(i), "PX", LEASE) for i in n)
    out = [
        ("acquire", "ours: fenced acquire of a free lock, `wait(0)` (acquire.lua)", b"",
         lambda c: b"".join(resp("EVALSHA", sha["acquire"], 2, key(c, i), "lock:fence", owner(i),
                                 LEASE) for i in n), "evalsha"),
        ("floor-acquire", "floor: TIME, SET … GET, SET NX PX", b"",
         lambda c: b"".join(resp("EVALSHA", sha["floor-acquire"], 2, key(c, i), "lock:fence",
                                 owner(i), LEASE, FENCE_TTL) for i in n), "evalsha"),
        ("acquire-wait", "ours: the same with the default wait (queues if busy)", b"",
         lambda c: b"".join(resp("EVALSHA", sha["acquire"], 2, key(c, i), "lock:fence", owner(i),
                                 LEASE, STAY) for i in n), "evalsha"),
        ("floor-acquire-wait", "floor: TIME, SET … GET, SET NX PX, HDEL", b"",
         lambda c: b"".join(resp("EVALSHA", sha["floor-acquire-wait"], 2, key(c, i), "lock:fence",
                                 owner(i), LEASE, FENCE_TTL) for i in n), "evalsha"),
        ("release", "ours: fenced release of an unmarked hold (release.lua)",
         lambda c: held(c, lambda i: f"{owner(i)} {token(i)}"),
         lambda c: b"".join(resp("EVALSHA", sha["release"], 1, key(c, i), f"{owner(i)} {token(i)}")
                            for i in n), "evalsha"),
        ("floor-release", "floor: GET, compare, DEL of \"<owner> <token>\"",
         lambda c: held(c, lambda i: f"{owner(i)} {token(i)}"),
         lambda c: b"".join(resp("EVALSHA", sha["floor-release"], 1, key(c, i),
                                 f"{owner(i)} {token(i)}") for i in n), "evalsha"),
        ("unfenced-release", "ours: unfenced release (release.lua)",
         lambda c: held(c, owner),
         lambda c: b"".join(resp("EVALSHA", sha["release"], 1, key(c, i), owner(i)) for i in n),
         "evalsha"),
        ("rslock-release", "rslock's release script (20-byte value)",
         lambda c: held(c, lambda i: "%040x" % i),
         lambda c: b"".join(resp("EVALSHA", sha["rslock-release"], 1, key(c, i), "%040x" % i)
                            for i in n), "evalsha"),
        ("unfenced-acquire", "ours: unfenced acquire (SET NX PX GET, no script)", b"",
         lambda c: b"".join(resp("SET", key(c, i), owner(i), "NX", "PX", LEASE, "GET") for i in n),
         "set"),
        ("rslock-acquire", "rslock's acquire (SET NX PX)", b"",
         lambda c: b"".join(resp("SET", key(c, i), "%040x" % i, "NX", "PX", LEASE) for i in n),
         "set"),
    ]
    # Semaphores: what `node/permits.rs` sends for a fenced permit with the
    # default wait (trailing arguments at their defaults left out), and for
    # its release; each release gives back a permit its case's setup took.
    permit = lambda script, c: b"".join(resp("EVALSHA", sha[script], 2, key(c, i), "lock:fence",
                                              permit_owner(i), LEASE, STAY) for i in n)
    give_back = lambda script: lambda c: b"".join(
        resp("EVALSHA", sha[script], 1, key(c, i), permit_owner(i)) for i in n)
    out += [
        ("permit-wait", "ours: fenced permit of a free semaphore, default wait (permit.lua)", b"",
         lambda c: permit("permit", c), "evalsha"),
        ("floor-permit-wait", "floor: HLEN, TIME, LLEN, SET … GET, HSET, PEXPIRE", b"",
         lambda c: permit("floor-permit", c), "evalsha"),
        ("release-permit", "ours: release of a live permit, nobody queued (release_permit.lua)",
         lambda c: permit("permit", c), give_back("release_permit"), "evalsha"),
        ("floor-release-permit", "floor: TIME, HGET, HDEL, LLEN",
         lambda c: permit("permit", c), give_back("floor-release-permit"), "evalsha"),
    ]
    if native:
        out.append(("native-release", f"ours where the server has it: {native} \"<owner> <token>\"",
                    lambda c: held(c, lambda i: f"{owner(i)} {token(i)}"),
                    lambda c: b"".join(resp(native, key(c, i), f"{owner(i)} {token(i)}") for i in n),
                    native.lower()))
    return out

print(f"{name}, {calls} pipelined calls a case" + (", under callgrind" if callgrind else ""))
print()
print("| case | what | µs per call (commandstats) | server CPU µs per call | instructions per call |")
print("|---|---|---|---|---|")
for (case, what, setup, measured, stat) in cases():
    if only and case not in only:
        continue
    cli("FLUSHALL")
    if setup:
        pipe(setup(case))
    data = measured(case)
    cli("CONFIG", "RESETSTAT")
    c0 = cpu()
    if callgrind:
        ir, _ = callgrind_window(lambda: pipe(data))
        ir = f"{ir / calls:,.0f}"
    else:
        pipe(data)
        ir = "—"
    c1 = cpu()
    st = commandstats().get(stat, (0, 0))
    if st[0] < calls:
        sys.exit(f"{case}: {stat} ran {st[0]} times, not {calls}")
    us = st[1] / st[0]
    print(f"| {case} | {what} | {us:.2f} | {(c1 - c0) * 1e6 / calls:.2f} | {ir} |", flush=True)

proc.terminate()
proc.wait()
if not os.environ.get("PROFILE_KEEP"):
    subprocess.run(["rm", "-rf", work])
PY
