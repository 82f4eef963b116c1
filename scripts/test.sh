#!/usr/bin/env bash
# Runs the whole test suite against real Redis processes (the protocol model
# in release), then the Redis-semantics, round-trip, read-write and
# operations tests, and the model's Lua host, once more against Valkey.
# Installs the server binaries it needs (Debian/Ubuntu, as root) when they
# are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-redis.sh
# The protocol model explores millions of states, far too slowly
# unoptimised: it runs once, in release, after the rest.
cargo test --workspace --exclude lock-model "$@"
cargo test -p lock-model --release "$@"

scripts/install-valkey.sh
# (Selected from the same package set as above: the build is reused.)
LOCK_TEST_SERVER=valkey-server cargo test --workspace --exclude lock-model --test redis_semantics \
  --test round_trips --test read_write --test operations "$@"
# The model's Lua host against Valkey too (its server steps run the scripts
# as Redis and Valkey would).
LOCK_TEST_SERVER=valkey-server cargo test -p lock-model --release --test host_vs_redis "$@"
