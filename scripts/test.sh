#!/usr/bin/env bash
# Runs the whole test suite against real Redis processes. Installs the Redis
# binaries it needs (Debian/Ubuntu, as root) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-redis.sh
cargo test --workspace "$@"
