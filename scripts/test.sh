#!/usr/bin/env bash
# Runs the whole test suite against real Redis processes, then the
# Redis-semantics, round-trip, read-write and operations tests, and the
# model's Lua host, once more against Valkey. The PostgreSQL engine's test
# binaries (`postgres_*`, and the Postgres scenarios of the fault suite)
# start their own throwaway `postgres` and `pgbouncer` processes. Installs
# the server binaries it needs (Debian/Ubuntu, as root) when they are
# missing. Arguments go to every `cargo test` (e.g. `-- --nocapture`).
#
# One build serves every step: every cargo command selects the whole
# workspace (a narrower selection unifies other features and builds again),
# and the protocol model, which explores millions of states, is optimised
# by profile overrides in Cargo.toml inside that same debug build.
#
# The steps that keep the CPU busy (unit tests, doctests, the compile-fail
# cases, the model) run one after another, alone. The integration test
# binaries mostly wait on timers, servers and processes (a few seconds of
# CPU in a minute): they run side by side in lanes, one binary at a time
# per lane, each lane with ports of its own (`LOCK_TEST_PORTS`), and with
# nothing CPU-bound beside them: four lanes by default (`LOCK_TEST_LANES=1`
# runs them one by one).
set -euo pipefail
cd "$(dirname "$0")/.."

# Runs a step and says how long it took.
timed() {
  local started=$SECONDS
  "$@"
  echo "== test.sh: ${*:1:6}: $((SECONDS - started)) s" >&2
}

timed scripts/install-redis.sh
timed scripts/install-valkey.sh
timed scripts/install-postgres.sh

timed cargo test --workspace --no-run "$@"

# Alone: CPU-bound.
timed cargo test --workspace --lib --bins "$@"
timed cargo test --workspace --doc "$@"
timed cargo test --workspace --test ui "$@"
timed cargo test --workspace --test bounded --test races --test failover --test permits "$@"
lanes_started=$SECONDS

# Side by side: every other integration test binary, then the Valkey runs.
# The longest first, so that the lanes end together. The fault suite runs
# its scenarios one at a time (~7 min in all): in three shards, each a job
# of its own (a job may carry libtest filters after the binary's name).
# The last shard is "every scenario not named before", so a new scenario
# runs without being listed here.
fault_a=(nemesis_history_with_fencing sentinel_planned_failovers_under_load)
fault_b=(outside_nemesis_read_write_locks outside_nemesis_write_locks reply_faults_one_connection_at_a_time
  cluster_slot_migrations_under_load cluster_resharding_with_holds)
skip_named=()
for t in "${fault_a[@]}" "${fault_b[@]}"; do skip_named+=(--skip "$t"); done
longest=(sentinel operations redlock read_write cluster postgres_deployments postgres_faults semaphores)
valkey=(redis_semantics round_trips read_write operations semaphores host_vs_redis)
# (`--test NAME` runs every package's binary of that name: names must be
# unique, or a job runs twice and a CPU-bound model would run in a lane.)
targets=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import collections, json, sys
skip = {"ui", "bounded", "races", "failover", "permits"}
names = [t["name"] for p in json.load(sys.stdin)["packages"]
         for t in p["targets"] if "test" in t["kind"]]
twice = [n for n, c in collections.Counter(names).items() if c > 1]
if twice:
    sys.exit(f"test targets of one name in two packages: {twice}")
for n in names:
    if n not in skip:
        print(n)
')
jobs=(
  "redis fault_suite --exact ${fault_a[*]}"
  "redis fault_suite --exact ${skip_named[*]}"
  "redis fault_suite --exact ${fault_b[*]}"
)
for t in "${longest[@]}"; do jobs+=("redis $t"); done
for t in $targets; do
  [[ " ${longest[*]} fault_suite " == *" $t "* ]] || jobs+=("redis $t")
done
for t in "${valkey[@]}"; do jobs+=("valkey $t"); done

lanes=${LOCK_TEST_LANES:-4}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
echo 0 >"$logs/next"
# Takes the next job off the list (under a lock: the lanes share it).
next_job() {
  flock "$logs/next" bash -c 'n=$(cat "$1"); echo $((n + 1)) >"$1"; echo "$n"' _ "$logs/next"
}
lane() {
  local n=$1 i server target filters
  shift
  # Ports 10000-31999 (or `LOCK_TEST_PORT_RANGE`) split between the lanes
  # (below the kernel's ephemeral range, from 32768 by default).
  local range=${LOCK_TEST_PORT_RANGE:-10000-31999}
  local first=${range%-*} last=${range#*-}
  local span=$(((last - first + 1) / lanes))
  local lo=$((first + n * span))
  while i=$(next_job) && ((i < ${#jobs[@]})); do
    read -r server target filters <<<"${jobs[$i]}"
    # The job's filters go after the caller's own `--` (or after one of ours).
    local args=("$@")
    if [[ -n $filters ]]; then
      [[ " ${args[*]} " == *" -- "* ]] || args+=(--)
      read -ra f <<<"$filters"
      args+=("${f[@]}")
    fi
    echo "=== $server-server: $target $filters" >>"$logs/$n"
    local started=$SECONDS
    if ! LOCK_TEST_PORTS="$lo-$((lo + span - 1))" LOCK_TEST_SERVER="$server-server" \
      cargo test --workspace --test "$target" "${args[@]}" >>"$logs/$n" 2>&1; then
      echo "FAILED: $target against $server-server" >>"$logs/$n"
      echo 999999 >"$logs/next" # the other lanes stop after their current job
      return 1
    fi
    echo "== lane $n: $server $target ${filters:0:40}: $((SECONDS - started)) s (at $((SECONDS - lanes_started)) s)" >>"$logs/times"
  done
}
pids=()
for ((n = 0; n < lanes; n++)); do
  lane "$n" "$@" &
  pids+=($!)
done
failed=0
for ((n = 0; n < lanes; n++)); do
  wait "${pids[$n]}" || failed=1
  cat "$logs/$n"
done
grep -h '^FAILED' "$logs"/[0-9]* >&2 || true
cat "$logs/times" >&2 2>/dev/null || true
echo "== test.sh: $lanes lanes: $((SECONDS - lanes_started)) s" >&2
exit "$failed"
