#!/usr/bin/env bash
# Start a PostgreSQL server on this machine for TACC's PostgreSQL store tests
# (crates/tacc-store's `postgres` contract suite, crates/taccd/tests/postgres.rs).
# Idempotent: the packages are installed only when missing, a cluster that already
# answers is left as it is, and the role is created only once.
#
# The tests create (and drop) one database per test, so the role `tacc` needs CREATEDB;
# they find the server through TACC_TEST_POSTGRES_URL, which this script prints.
#
# Usage (as root): scripts/ci/setup-postgres.sh        # install + start + role
#                  scripts/ci/setup-postgres.sh stop   # stop the cluster
set -euo pipefail

# Only the URL goes to stdout, which callers capture: every command below may print
# (pg_ctlcluster warns about systemd on stdout on a fresh machine), so stdout is the
# caller's stderr until the last line.
exec 3>&1 1>&2

ROLE=tacc
PASSWORD=tacc
PORT=${TACC_TEST_POSTGRES_PORT:-5432}
START_DEADLINE_SECS=${POSTGRES_START_DEADLINE_SECS:-60}

log() { echo "setup-postgres: $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1; }

# The newest installed cluster (Debian names it <version> main).
cluster() { pg_lsclusters -h 2>/dev/null | awk '$2 == "main" { print $1 }' | sort -n | tail -n 1; }

if [ "${1:-}" = stop ]; then
  version=$(cluster)
  [ -n "$version" ] && pg_ctlcluster "$version" main stop 2>/dev/null || true
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "must run as root (it installs packages and starts the cluster)"
  exit 1
fi

if ! need pg_ctlcluster || [ -z "$(cluster)" ]; then
  log "installing postgresql from the distribution"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi

version=$(cluster)
if [ -z "$version" ]; then
  log "no PostgreSQL cluster after installing postgresql (pg_lsclusters lists none)"
  exit 1
fi

as_postgres() { runuser -u postgres -- "$@"; }

if ! as_postgres pg_isready -q -p "$PORT"; then
  log "starting cluster $version/main on port $PORT"
  # The server outlives this script: it must not inherit fd 3, the caller's capture, or
  # the caller would wait for an end of file that comes only when PostgreSQL stops.
  pg_ctlcluster "$version" main start 3>&- </dev/null
  deadline=$((SECONDS + START_DEADLINE_SECS))
  until as_postgres pg_isready -q -p "$PORT"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "PostgreSQL did not answer within ${START_DEADLINE_SECS}s; last log lines:"
      tail -n 20 "/var/log/postgresql/postgresql-$version-main.log" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
fi

if [ "$(as_postgres psql -p "$PORT" -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != 1 ]; then
  log "creating role $ROLE (LOGIN, CREATEDB)"
  as_postgres psql -q -p "$PORT" -c "CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD'"
fi

# The TLS test (crates/taccd/tests/postgres.rs) connects with sslmode=verify-full against
# the certificate Debian's packages give every cluster (ssl-cert's snakeoil, for localhost).
if [ "$(as_postgres psql -p "$PORT" -tAc "SHOW ssl")" != on ]; then
  log "the cluster serves no TLS (ssl = off in its postgresql.conf); the TLS test needs it"
  exit 1
fi

url="postgres://$ROLE:$PASSWORD@127.0.0.1:$PORT/postgres"
log "ready: PostgreSQL $version at $url"
echo "$url" >&3
