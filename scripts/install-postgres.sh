#!/usr/bin/env bash
# Makes sure the PostgreSQL server binaries (initdb, postgres, pg_basebackup,
# psql, and pg_stat_statements) and pgbouncer are installed, for the
# Postgres engine's tests: they start their own throwaway servers.
# Installs the Debian packages when missing (apt-get update once, as root).
set -euo pipefail

have_server() {
  if [ -n "${LOCK_TEST_PG_BIN:-}" ]; then
    [ -x "$LOCK_TEST_PG_BIN/initdb" ] && return 0
  fi
  for bin in /usr/lib/postgresql/*/bin; do
    [ -x "$bin/initdb" ] && [ -x "$bin/postgres" ] && [ -x "$bin/pg_basebackup" ] &&
      [ -f "$bin/../lib/pg_stat_statements.so" ] && return 0
  done
  return 1
}

missing=()
have_server || missing+=(postgresql postgresql-contrib)
command -v psql >/dev/null || missing+=(postgresql-client)
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing ${missing[*]} ..." >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
# The tests make their own data directories: no cluster for the package to
# create (and start on port 5432).
$sudo mkdir -p /etc/postgresql-common/createcluster.d
echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.d/lock-tests.conf >/dev/null
$sudo apt-get update -qq
# The packages' own services may fail to start without an init system; the
# tests start their own servers on free ports, so that is fine.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null || true
have_server || { echo "could not install the PostgreSQL server" >&2; exit 1; }
command -v psql >/dev/null || { echo "could not install psql" >&2; exit 1; }
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || { echo "could not install pgbouncer" >&2; exit 1; }
id postgres >/dev/null 2>&1 || { echo "no postgres user (the server refuses root)" >&2; exit 1; }
