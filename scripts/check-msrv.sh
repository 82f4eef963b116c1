#!/usr/bin/env bash
# The MSRV check this machine can make (it has one Rust toolchain and
# cannot fetch another): every crate that lock-runtime and lock-macros
# depend on (all features, as locked in Cargo.lock) declares a
# `rust-version` no higher than ours. Our own code is held to it by
# clippy's `incompatible_msrv` lint, which `.ci/run` runs with `-D warnings`.
# What neither covers: language features (not std items) newer than the
# MSRV, and compiler behaviour; `cargo +<msrv> check` would.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo metadata --format-version 1 --all-features --locked | python3 -c '
import json, sys
m = json.load(sys.stdin)
pk = {p["id"]: p for p in m["packages"]}
nodes = {n["id"]: n for n in m["resolve"]["nodes"]}
def v(s): return (tuple(int(x) for x in (s or "0").split(".")) + (0, 0, 0))[:3]
ours = {p["name"]: p for p in m["packages"] if p["name"] in ("lock-runtime", "lock-macros")}
msrv = v(ours["lock-runtime"]["rust_version"])
bad, seen, todo = [], set(), [p["id"] for p in ours.values()]
while todo:
    i = todo.pop()
    if i in seen:
        continue
    seen.add(i)
    p = pk[i]
    if v(p.get("rust_version")) > msrv:
        bad.append("%s %s needs Rust %s" % (p["name"], p["version"], p["rust_version"]))
    for d in nodes[i]["deps"]:
        if any(k["kind"] in (None, "build") for k in d["dep_kinds"]):
            todo.append(d["pkg"])
shown = ours["lock-runtime"]["rust_version"]
if bad:
    print(f"MSRV {shown} is not honest; locked dependencies need more:", *sorted(bad), sep="\n  ")
    sys.exit(1)
print(f"MSRV {shown}: all {len(seen)} crates lock-runtime and lock-macros build with declare it or less")
'
