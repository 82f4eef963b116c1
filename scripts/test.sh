#!/usr/bin/env bash
# Runs the whole test suite against real Redis processes, then the
# Redis-semantics, round-trip, read-write and operations tests once more
# against Valkey. Installs the server binaries it needs (Debian/Ubuntu, as
# root) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-redis.sh
cargo test --workspace "$@"

scripts/install-valkey.sh
LOCK_TEST_SERVER=valkey-server cargo test -p tests --test redis_semantics --test round_trips \
  --test read_write --test operations "$@"
