#!/usr/bin/env bash
# Install the Debian packages the test suite needs when they are missing.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# The PgBouncer run of `make test` (tests/integration/pgbouncer.py starts a private one).
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
# The failover test (tests/integration/pg_failover.py): pg_autoctl and its extension.
pg_major="$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -n1)"
command -v pg_autoctl >/dev/null 2>&1 || need+=(pg-auto-failover-cli)
if [ -n "$pg_major" ] && [ ! -e "/usr/lib/postgresql/$pg_major/lib/pgautofailover.so" ]; then
  need+=("postgresql-$pg_major-auto-failover")
fi
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != "0" ]; then
  echo "missing system packages: ${need[*]} (install them, or run as root)" >&2
  exit 0
fi
echo "installing system packages: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
