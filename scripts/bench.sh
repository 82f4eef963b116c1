#!/usr/bin/env bash
# Benchmarks: this lock runtime side by side with raw Redis round trips,
# rslock and redis-py, all in one run against redis-servers the bench starts
# itself, and what a lock costs on Redis and on Valkey side by side (server
# and client CPU, commands, memory per lock name). Then the PostgreSQL
# engine against a ShedLock-style lease row and advisory locks
# (tests/benches/postgres.rs), on a throwaway postgres it starts. Prints
# markdown tables and writes docs/BENCHMARKS.md.
#
# Installs what it needs when missing (Debian/Ubuntu, as root or with sudo):
# redis-server and redis-tools (redis-benchmark) via apt, valkey-server
# (scripts/install-valkey.sh), and redis-py via pip into a virtualenv under
# the cargo target directory.
#
#   scripts/bench.sh                      # the full run, a few minutes
#   LOCKBENCH_QUICK=1 scripts/bench.sh    # a short smoke run, docs left as they are
#   LOCKBENCH_ONLY=4,6 scripts/bench.sh   # some cases only (1-12), docs left as they are
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
apt_install() {
  $sudo apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null || true
}

scripts/install-redis.sh
scripts/install-postgres.sh
if ! command -v redis-benchmark >/dev/null; then
  echo "installing redis-tools (redis-benchmark) ..." >&2
  apt_install redis-tools
fi
command -v redis-benchmark >/dev/null || echo "warning: no redis-benchmark; case 3 runs without its ceiling" >&2
# The second server of cases 9 and 10 (Valkey next to Redis).
scripts/install-valkey.sh || echo "warning: no valkey-server; cases 9 and 10 run on Redis only" >&2

# The Python contender: redis-py's Lock. Use $PYTHON (or python3) if it
# already has redis-py, else a virtualenv with redis-py from PyPI.
target_dir="${CARGO_TARGET_DIR:-target}"
venv="$target_dir/bench-venv"
python="${PYTHON:-python3}"
if ! "$python" -c 'import redis' 2>/dev/null; then
  if [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null || apt_install python3
    if ! python3 -m venv "$venv" 2>/dev/null; then
      apt_install python3-venv
      rm -rf "$venv"
      python3 -m venv "$venv" || true
    fi
  fi
  if [ -x "$venv/bin/python" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check redis || true
    python="$(cd "$(dirname "$venv/bin/python")" && pwd)/python"
  fi
fi
if "$python" -c 'import redis' 2>/dev/null; then
  export PYTHON="$python"
else
  echo "warning: could not install redis-py; the bench runs without the Python contender" >&2
fi

cargo bench -p tests --bench locks "$@"
cargo bench -p tests --bench postgres
