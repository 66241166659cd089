#!/usr/bin/env bash
# PostgreSQL claims per second directly and through PgBouncer, in one run on this machine,
# beside pgbench on the same two paths as the ceiling (issue 32):
#   the store's claim, claim + complete and replay (criterion, 32 concurrent tasks) on
#     1. a direct connection (cached prepared statements, settings as startup options),
#     2. the pooled path on a direct connection (?pooler=transaction: unnamed statements,
#        settings per transaction),
#     3. a private PgBouncer in transaction mode (found out by the store);
#   pgbench, one INSERT ... ON CONFLICT DO NOTHING per transaction, 32 clients, directly
#   (-M prepared, -M extended) and through the same kind of PgBouncer (-M extended).
# Needs PostgreSQL (127.0.0.1:5432, trust, database test), pgbench and pgbouncer (Debian:
# apt-get install pgbouncer; run as root it runs as the postgres user). Loopback only; about
# 2 minutes. The schemas it writes are dropped at exit.
#
#   bash bench/pgbouncer.sh [PGBENCH_SECONDS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
WORK=$(mktemp -d)
PG=postgres://postgres@127.0.0.1:5432/test
BOUNCER_PID=
cleanup() {
  [ -n "$BOUNCER_PID" ] && kill "$BOUNCER_PID" 2>/dev/null || true
  psql -q "$PG" -c 'DROP SCHEMA IF EXISTS idem_bench_pgb CASCADE' 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== the store (cargo bench -p idem-store-postgres --bench claims)"
FILTER='postgres/(claim|claim_complete|replay)/'
for route in direct pooled pgbouncer; do
  echo "-- $route"
  case $route in
    direct) env=() ;;
    pooled) env=(IDEM_TEST_POSTGRES="$PG?pooler=transaction") ;;
    pgbouncer) env=(IDEM_BENCH_PGBOUNCER=transaction) ;;
  esac
  env "${env[@]}" cargo bench -q -p idem-store-postgres --bench claims -- "$FILTER" 2>&1 |
    grep -E '^postgres|thrpt:' | grep -v '%' || true
done

echo "== pgbench: one INSERT ... ON CONFLICT DO NOTHING per transaction, 32 clients, ${SECS} s"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$WORK/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=5432
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $WORK/users.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
INI
echo '"postgres" ""' > "$WORK/users.txt"
cat > "$WORK/claim.sql" <<'SQL'
\set k random(1, 1000000000000)
INSERT INTO idem_bench_pgb.records (key, fingerprint) VALUES ('k' || :k || '-' || :client_id, '\x01') ON CONFLICT DO NOTHING;
SQL
chmod 755 "$WORK"; chmod 644 "$WORK"/*
if [ "$(id -u)" = 0 ]; then as_pg=(-u postgres); else as_pg=(); fi
pgbouncer "${as_pg[@]}" "$WORK/pgbouncer.ini" >/dev/null 2>&1 &
BOUNCER_PID=$!
psql -q "$PG" -c 'DROP SCHEMA IF EXISTS idem_bench_pgb CASCADE; CREATE SCHEMA idem_bench_pgb;
  CREATE TABLE idem_bench_pgb.records (key text COLLATE "C" PRIMARY KEY, fingerprint bytea)'
for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.1; done
for path in "5432 prepared" "5432 extended" "$port extended"; do
  set -- $path
  label=direct; [ "$1" = "$port" ] && label=pgbouncer
  printf '%-10s -M %-9s ' "$label" "$2"
  pgbench -n -h 127.0.0.1 -p "$1" -U postgres -c 32 -j 2 -T "$SECS" -M "$2" -f "$WORK/claim.sql" test 2>&1 |
    grep -E '^tps' || echo "failed"
done
