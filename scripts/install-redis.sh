#!/usr/bin/env bash
# Makes sure redis-server, redis-cli and redis-sentinel are on PATH, and
# openssl, which the TLS tests make their certificates with.
set -euo pipefail

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v redis-sentinel >/dev/null || missing+=(redis-sentinel)
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing ${missing[*]} ..." >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
# The packages' own service may fail to start without an init system; the
# tests start their own servers on free ports, so that is fine.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null || true
for bin in redis-server redis-cli redis-sentinel openssl; do
  command -v "$bin" >/dev/null || { echo "could not install $bin" >&2; exit 1; }
done
