#!/usr/bin/env bash
# Gateway throughput and latency, every configuration in one run on this machine:
#   direct upstream | nginx as a plain reverse proxy |
#   idem serve (memory, sqlite, postgres, redis) x (new keys, replays) |
#   the raw stores: pgbench INSERT ... ON CONFLICT and redis-benchmark SET NX, same client count
# The upstream is nginx answering 201 with a small JSON body, so it is never the bottleneck.
# Needs wrk and nginx (Debian: apt-get install wrk nginx), and PostgreSQL (127.0.0.1:5432, trust,
# database test) and Redis (127.0.0.1:6379) with pgbench and redis-benchmark. Loopback only;
# bounded by DURATION. The PostgreSQL schema and Redis prefix it writes are deleted at exit.
#
#   bash bench/gateway.sh [DURATION_SECONDS=10] [CONNECTIONS=32]
#   IDEM_BIN=/path/to/idem bash bench/gateway.sh ...   # another build's binary
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-10}
CONNS=${2:-32}
WORK=$(mktemp -d)
PG=postgres://postgres@127.0.0.1:5432/test
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  nginx -p "$WORK" -c nginx.conf -s stop 2>/dev/null || true
  psql -q "$PG" -c 'DROP SCHEMA IF EXISTS idem_bench_gw CASCADE; DROP SCHEMA IF EXISTS idem_bench_raw CASCADE' 2>/dev/null || true
  redis-cli --scan --pattern 'idem-bench-gw:*' | xargs -r -n 1000 redis-cli del >/dev/null 2>&1 || true
  redis-cli --scan --pattern 'idem-bench-raw:*' | xargs -r -n 1000 redis-cli del >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

# shellcheck source=bench/common.sh
. bench/common.sh
idem_binary
start_nginx "$WORK" 18001 18002

write_load "$WORK"
IDEM_LOG=error $IDEM serve --listen 127.0.0.1:18003 --admin-listen 127.0.0.1:18013 --upstream http://127.0.0.1:18001 --store memory: --config "$WORK/idem.toml" >/dev/null &
IDEM_LOG=error $IDEM serve --listen 127.0.0.1:18004 --admin-listen 127.0.0.1:18014 --upstream http://127.0.0.1:18001 --store "sqlite:$WORK/idem.db" --config "$WORK/idem.toml" >/dev/null &
IDEM_LOG=error $IDEM serve --listen 127.0.0.1:18005 --admin-listen 127.0.0.1:18015 --upstream http://127.0.0.1:18001 --store "$PG?schema=idem_bench_gw" --config "$WORK/idem.toml" >/dev/null &
IDEM_LOG=error $IDEM serve --listen 127.0.0.1:18006 --admin-listen 127.0.0.1:18016 --upstream http://127.0.0.1:18001 --store "redis://127.0.0.1:6379/?prefix=idem-bench-gw&durability=volatile" --config "$WORK/idem.toml" >/dev/null &
sleep 2

for port in 18003 18004 18005 18006; do
  curl -s -o /dev/null -X POST "http://127.0.0.1:$port/v1/charges" -H 'Idempotency-Key: bench-replay' -H 'Content-Type: application/json' -d "$BODY"
done

PROXY_RPS=
run() { # label port script
  local out ratio=
  out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/$3" "http://127.0.0.1:$2/v1/charges")
  local rps p50 p99 non2xx
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  # Each idem row as a multiple of the plain proxy's rate in this run (issue 16's targets).
  if [ "$2" = 18002 ]; then PROXY_RPS=$rps; ratio=1.00
  elif [ "$2" != 18001 ] && [ -n "$PROXY_RPS" ]; then ratio=$(awk -v a="$rps" -v b="$PROXY_RPS" 'BEGIN {printf "%.2f", a / b}'); fi
  printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$rps" "$p50" "$p99" "${non2xx:-0}" "$ratio"
}

echo "wrk -t2 -c$CONNS -d${DURATION}s, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo '| path | requests/s | p50 | p99 | non-2xx | x plain proxy |'
echo '|---|---:|---:|---:|---:|---:|'
run "direct upstream (nginx return 201)" 18001 same.lua
run "nginx reverse proxy (plain, keepalive)" 18002 same.lua
run "idem serve, memory, new keys" 18003 new.lua
run "idem serve, memory, replays" 18003 same.lua
run "idem serve, sqlite, new keys" 18004 new.lua
run "idem serve, sqlite, replays" 18004 same.lua
run "idem serve, postgres, new keys" 18005 new.lua
run "idem serve, postgres, replays" 18005 same.lua
run "idem serve, redis, new keys" 18006 new.lua
run "idem serve, redis, replays" 18006 same.lua

# The raw stores, same client count: what one insert-if-absent costs without idem.
psql -q "$PG" -c 'DROP SCHEMA IF EXISTS idem_bench_raw CASCADE; CREATE SCHEMA idem_bench_raw; CREATE TABLE idem_bench_raw.keys (key text PRIMARY KEY, fingerprint bytea)'
echo "INSERT INTO idem_bench_raw.keys VALUES (md5(random()::text), '\\x0102') ON CONFLICT DO NOTHING;" > "$WORK/insert.sql"
tps=$(pgbench -h 127.0.0.1 -U postgres -n -c "$CONNS" -j 2 -T "$DURATION" -f "$WORK/insert.sql" test 2>/dev/null | awk '/^tps/ {print $3}')
printf '| %s | %s | | | | |\n' "pgbench: INSERT ... ON CONFLICT DO NOTHING, one per transaction" "$tps"
rps=$(redis-benchmark -q -c "$CONNS" -n $((DURATION * 100000)) -r 100000000 set idem-bench-raw:__rand_int__ v NX PX 60000 2>/dev/null | tr '\r' '\n' | awk '/requests per second/ {print $(NF-5)}' | tail -1)
printf '| %s | %s | | | | |\n' "redis-benchmark: SET key v NX PX 60000" "$rps"
