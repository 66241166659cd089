#!/usr/bin/env bash
# Instructions per request inside `idem serve` (all its threads, user space), under callgrind:
# counts that stay the same run after run on a busy machine, unlike requests per second.
# The memory store unless STORE says otherwise, an nginx upstream answering 201 (as in
# bench/gateway.sh), new keys and replays.
# Beside them, the floor: idem serve forwarding a POST no route keys, a bare hyper proxy
# (crates/idem-gateway/examples/bare_proxy.rs), and that server answering each request itself
# (the floor under a replay).
# After a warm-up the counters are zeroed, wrk -t1 -c8 runs DURATION seconds, the counters are
# dumped, and their total is divided by the requests wrk completed. Needs valgrind, wrk and
# nginx (Debian: apt-get install valgrind wrk nginx). Loopback only.
#
#   bash bench/gateway_instructions.sh [DURATION_SECONDS=10] [STORE=memory:]
#   IDEM_BIN=/path/to/idem bash bench/gateway_instructions.sh    # another build's binary
# e.g. STORE: "redis://127.0.0.1:6379/?prefix=idem-bench-instr&durability=volatile",
#   "postgres://postgres@127.0.0.1:5432/test?schema=idem_bench_instr", "sqlite:/tmp/x.db"
#   (that prefix and schema are deleted at exit)
#   KEEP=1 ...    # keep the callgrind files (printed) for callgrind_annotate --inclusive=yes
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-10}
STORE=${2:-memory:}
WORK=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  nginx -p "$WORK" -c nginx.conf -s stop 2>/dev/null || true
  redis-cli --scan --pattern 'idem-bench-instr:*' 2>/dev/null | xargs -r -n 1000 redis-cli del >/dev/null 2>&1 || true
  psql -q postgres://postgres@127.0.0.1:5432/test -c 'DROP SCHEMA IF EXISTS idem_bench_instr CASCADE' >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

# shellcheck source=bench/common.sh
. bench/common.sh
idem_binary
start_nginx "$WORK" 18101 18102
write_load "$WORK"

# A POST with the same body and no key, to a path no route keys: forwarded as it is.
cat >"$WORK/pass.lua" <<LUA
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
LUA
cargo build --release -q -p idem-gateway --example bare_proxy
BARE=${CARGO_TARGET_DIR:-target}/release/examples/bare_proxy

measure() { # label script path [bare MODE]
  local out="$WORK/callgrind.$2.${4:-idem}${5:-}"
  if [ -n "${4:-}" ]; then
    valgrind --tool=callgrind --callgrind-out-file="$out" "$BARE" 127.0.0.1:18103 "$5" \
      127.0.0.1:18101 "$(nproc)" >/dev/null 2>"$out.log" &
  else
    IDEM_LOG=error valgrind --tool=callgrind --callgrind-out-file="$out" "$IDEM" serve \
      --listen 127.0.0.1:18103 --admin-listen 127.0.0.1:18113 --upstream http://127.0.0.1:18101 \
      --store "$STORE" --config "$WORK/idem.toml" >/dev/null 2>"$out.log" &
  fi
  local pid=$!
  for _ in $(seq 1 120); do curl -s -o /dev/null http://127.0.0.1:18103/ && break; sleep 0.5; done
  curl -s -o /dev/null -X POST http://127.0.0.1:18103/v1/charges -H 'Idempotency-Key: bench-replay' \
    -H 'Content-Type: application/json' -d "$BODY"
  wrk -t1 -c8 -d4s -s "$WORK/$2" "http://127.0.0.1:18103$3" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  local n
  n=$(wrk -t1 -c8 -d"${DURATION}s" -s "$WORK/$2" "http://127.0.0.1:18103$3" | awk '/requests in/ {print $1}')
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local total
  total=$(callgrind_annotate "$out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '| %s | %s | %s |\n' "$1" "$n" "$((total / n))"
  [ -z "${KEEP:-}" ] || echo "  (profile: $out.1)"
}

echo "| idem serve, store $STORE | requests counted | instructions per request |"
echo "|---|---:|---:|"
measure "new keys" new.lua /v1/charges
measure "replays" same.lua /v1/charges
# The floor under the forwarding path: idem serve forwarding a POST no route keys (no store),
# and crates/idem-gateway/examples/bare_proxy.rs (hyper's server and client on the same
# threads, nothing of idem's).
measure "a POST no route keys (forwarded, no store)" pass.lua /v1/unkeyed
measure "bare hyper proxy, pooled upstream connections" pass.lua /v1/unkeyed bare pooled
# Under a replay: the same hyper server reading each body and answering it itself.
measure "bare hyper server answering itself (the floor under a replay)" same.lua /v1/charges bare answer
