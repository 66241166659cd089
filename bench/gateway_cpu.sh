#!/usr/bin/env bash
# What a request costs `idem serve` in CPU on real hardware, where callgrind's instruction
# counts (bench/gateway_instructions.sh) miss the kernel's share and the cost of waking
# threads: CPU microseconds per request (user and system, from /proc/PID/stat) and context
# switches per request (all of the process's threads, from /proc/PID/task/*/status), for new
# keys and replays under wrk -t2 -c64, with the per-thread split. An nginx upstream answers
# 201, as in bench/gateway.sh. Needs wrk and nginx (Debian: apt-get install wrk nginx).
#
#   bash bench/gateway_cpu.sh [DURATION_SECONDS=5] [STORE=memory:]
#   IDEM_BIN=/path/to/idem bash bench/gateway_cpu.sh ...     # another build's binary
# e.g. STORE: "redis://127.0.0.1:6379/?prefix=idem-bench-cpu&durability=volatile"
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-5}
STORE=${2:-memory:}
WORK=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  nginx -p "$WORK" -c nginx.conf -s stop 2>/dev/null || true
  redis-cli --scan --pattern 'idem-bench-cpu:*' 2>/dev/null | xargs -r -n 1000 redis-cli del >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# shellcheck source=bench/common.sh
. bench/common.sh
idem_binary
start_nginx "$WORK" 18201 18202
write_load "$WORK"
IDEM_LOG=error $IDEM serve --listen 127.0.0.1:18203 --admin-listen 127.0.0.1:18213 \
  --upstream http://127.0.0.1:18201 --store "$STORE" --config "$WORK/idem.toml" >/dev/null &
PID=$!
sleep 2
curl -s -o /dev/null -X POST "http://127.0.0.1:18203/v1/charges" -H 'Idempotency-Key: bench-replay' -H 'Content-Type: application/json' -d "$BODY"

# One line per thread: name, context switches, CPU ticks (user + system).
threads() {
  for t in /proc/$PID/task/*; do
    echo "$(tr ' ' _ <"$t/comm") $(awk '/ctxt_switches/ {s += $2} END {print s}' "$t/status") $(awk '{print $14 + $15}' "$t/stat")"
  done | sort
}
TICK=$(getconf CLK_TCK)
echo "idem serve --store $STORE, wrk -t2 -c64 -d${DURATION}s, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo '| requests | requests/s | user µs/request | system µs/request | context switches/request | CPU µs/request by thread |'
echo '|---|---:|---:|---:|---:|---|'
for row in "new.lua new keys" "same.lua replays"; do
  set -- $row
  read -r u0 s0 < <(awk '{print $14, $15}' /proc/$PID/stat)
  threads >"$WORK/before"
  out=$(wrk -t2 -c64 -d"${DURATION}s" -s "$WORK/$1" "http://127.0.0.1:18203/v1/charges")
  read -r u1 s1 < <(awk '{print $14, $15}' /proc/$PID/stat)
  threads >"$WORK/after"
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  # Threads of one name (tokio's workers) are summed.
  split=$(paste "$WORK/before" "$WORK/after" | awk -v n="$n" -v t="$TICK" '
    { cs += $5 - $2; cpu[$1] += $6 - $3 }
    END { for (k in cpu) if (cpu[k] > 0) printf "%s %.1f; ", k, cpu[k] / t * 1e6 / n; printf "|%.2f", cs / n }')
  awk -v n="$n" -v r="$rps" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v t="$TICK" -v l="${*:2}" -v parts="$split" 'BEGIN {
    i = index(parts, "|"); printf "| %s | %s | %.1f | %.1f | %s | %s |\n", l, r, u / t * 1e6 / n, s / t * 1e6 / n, substr(parts, i + 1), substr(parts, 1, i - 1) }'
done
