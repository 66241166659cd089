#!/usr/bin/env bash
# CPU per request, every proxy beside nginx in one run (issue 33's table).
#
# On these shared 2-core machines a rate moves with the machine (nginx alone has moved from
# 35,000 to 50,000 requests/s between runs minutes apart); the CPU a process spends per
# request it completes does not move that way. So each row is measured as: user + system CPU
# of the measured process (all its threads, from /proc/PID/stat) over the run, divided by the
# requests wrk completed, and compared with the same figure for nginx as a plain reverse proxy
# measured in the same run, first and again last: the ratio is to the mean of the two, since
# the machine moves while the rows run (nginx alone has read 14 µs in one run and 18 µs in the
# next, minutes apart). Requests/s and p99 stay beside it, for reference only.
#
# Every proxy runs in its own process against one upstream: a separate nginx answering 201
# with a small JSON body. The rows:
#   nginx reverse proxy (1 worker, keep-alive upstream)        the baseline, 1.00
#   idem serve on memory, SQLite, Redis, PostgreSQL: new keys and replays
#   (row `uncached`) SQLite replays with the completed-record cache off (`[limits] cache_bytes = 0`):
#   each one answered by the store, as after a restart or an eviction
#   the floor: idem serve forwarding an unkeyed POST, and a bare hyper proxy (no idem) with
#   hyper-util's pooled client and with request-driven upstream connections; and under a
#   replay, the same hyper server reading each body and answering it itself
#   idempotent-proxy (ldclabs) on memory and on Redis, when PEER_BIN names its server binary
# Each row also gives the measured process's CPU split into user and system time, and how
# often per request its threads were taken off a core while runnable (involuntary context
# switches). The system share is the kernel's TCP path, which on loopback runs the reader's
# receive path inside each write; a process chooses only how many system calls it makes, and
# the cost of each moves with the machine's kernel and hypervisor more than the user share
# does. The switches show whether the threads were fighting wrk for the cores.
# For Redis and PostgreSQL the store server's own CPU per request is given beside the
# gateway's (redis-server's process; every postgres process of the cluster), and for every idem
# row the split by thread (tokio's workers summed under one name).
#
#   bash bench/cpu_per_request.sh [DURATION_SECONDS=5] [ROWS="nginx memory floor sqlite redis postgres peer"]
#   (rows not run unless named: uncached)
#   IDEM_BIN=/path/to/idem bash bench/cpu_per_request.sh ...     # another build's binary
#   PEER_BIN=/path/to/idempotent-proxy-server bash bench/cpu_per_request.sh ...
#
# Needs wrk and nginx (Debian: apt-get install wrk nginx), and for those rows PostgreSQL
# (127.0.0.1:5432, trust, database test) and Redis (127.0.0.1:6379). The PostgreSQL schema
# and the Redis keys it writes are deleted at exit. The peer is built from its source in a
# scratch directory (github.com/ldclabs/idempotent-proxy, `cargo build --release -p
# idempotent-proxy-server`); it is never part of this repository.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-5}
ROWS=${2:-nginx memory floor sqlite redis postgres peer}
CONNS=64
WORK=$(mktemp -d)
PG=postgres://postgres@127.0.0.1:5432/test
SCHEMA=idem_bench_cpu
PREFIX=idem-bench-cpu
PEER_PREFIX=idem-bench-peer
UPSTREAM=18301
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  nginx -p "$WORK/upstream" -c nginx.conf -s stop 2>/dev/null || true
  nginx -p "$WORK/proxy" -c nginx.conf -s stop 2>/dev/null || true
  psql -q "$PG" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" 2>/dev/null || true
  for p in "$PREFIX" "$PEER_PREFIX"; do
    redis-cli --scan --pattern "*$p*" 2>/dev/null | xargs -r -n 1000 redis-cli del >/dev/null 2>&1 || true
  done
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

# shellcheck source=bench/common.sh
. bench/common.sh
idem_binary
write_load "$WORK"
# A POST with the same body and no key, to a path no route keys: forwarded as it is.
cat >"$WORK/pass.lua" <<LUA
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
LUA

# Starts one nginx with one worker, its files in WORK/NAME, serving SERVER (the body of its one
# `server` block) beside the `http`-level lines given in EXTRA.
start_one_nginx() { # NAME SERVER [EXTRA]
  local dir="$WORK/$1"
  mkdir -p "$dir/logs"
  cat >"$dir/nginx.conf" <<NGINX
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  ${3:-}
  server { keepalive_requests 1000000; $2 }
}
NGINX
  nginx -p "$dir" -c nginx.conf
}
# The upstream and the plain proxy are two nginx instances, so the proxy's worker is measured
# alone.
start_one_nginx upstream "listen 127.0.0.1:$UPSTREAM;
    location / { default_type application/json; return 201 '{\"charge_id\":\"ch_1\",\"amount_cents\":4900}'; }"
start_one_nginx proxy 'listen 127.0.0.1:18302;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }' \
  "upstream app { server 127.0.0.1:$UPSTREAM; keepalive 128; keepalive_requests 1000000; }"
sleep 0.5

TICK=$(getconf CLK_TCK)
# User and system CPU ticks of some processes, all their threads, summed: "USER SYSTEM".
user_system() { # PID...
  local u=0 s=0 p pu ps
  for p in "$@"; do
    if [ -r "/proc/$p/stat" ]; then
      read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat" 2>/dev/null || echo 0 0)
      u=$((u + pu)) s=$((s + ps))
    fi
  done
  echo "$u $s"
}
# CPU ticks (user + system) of some processes, all their threads, summed.
ticks() { # PID...
  local u s
  read -r u s < <(user_system "$@")
  echo $((u + s))
}
# How often the threads of some processes were taken off a core while they could still run
# (involuntary context switches, summed): on these 2 cores, mostly by a wrk thread that the
# process's own write to its socket woke.
preempted() { # PID...
  local n=0 p
  for p in "$@"; do
    n=$((n + $(cat /proc/"$p"/task/*/status 2>/dev/null | awk '/^nonvoluntary_ctxt_switches/ {s += $2} END {print s + 0}')))
  done
  echo "$n"
}
# One line per thread of PID: name and CPU ticks.
threads() { # PID
  for t in /proc/"$1"/task/*; do
    echo "$(tr ' ' _ <"$t/comm") $(awk '{print $14 + $15}' "$t/stat")"
  done | sort
}
postgres_pids() { pgrep -u postgres -d ' ' postgres || true; }
redis_pid() { redis-cli info server 2>/dev/null | tr -d '\r' | awk -F: '$1 == "process_id" {print $2}'; }

wait_port() { # PORT
  for _ in $(seq 100); do
    if curl -s -o /dev/null "http://127.0.0.1:$1/"; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on $1" >&2
  exit 1
}

# Each row's line, kept until nginx has been measured again at the end: the ratios are to
# the mean of its two runs, first and last (the machine moves while the rows run).
ROWS_OUT=$WORK/rows
NGINX_RUNS=()
# Runs wrk against PORT with SCRIPT and keeps the row. PIDS are the measured process's;
# SERVER_PIDS a function printing the store server's PIDs (or empty); THREADS_OF a PID whose
# threads are split (or empty).
row() { # LABEL PORT SCRIPT PATH "PIDS" SERVER_PIDS THREADS_OF
  local label=$1 port=$2 script=$3 path=$4 pids=$5 server=$6 split_of=$7
  local c0 c1 s0=0 s1=0 spids="" out n rps p99 non2xx cpu scpu="" split="" us0 us1 k0 k1 kernel
  [ -n "$server" ] && spids=$($server)
  us0=$(user_system $pids)
  c0=$(awk '{print $1 + $2}' <<<"$us0")
  k0=$(preempted $pids)
  [ -n "$spids" ] && s0=$(ticks $spids)
  [ -n "$split_of" ] && threads "$split_of" >"$WORK/before"
  out=$(wrk -t2 -c$CONNS -d"${DURATION}s" --latency -s "$WORK/$script" "http://127.0.0.1:$port$path")
  us1=$(user_system $pids)
  c1=$(awk '{print $1 + $2}' <<<"$us1")
  k1=$(preempted $pids)
  [ -n "$spids" ] && s1=$(ticks $spids)
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/Requests\/sec/ {printf "%d", $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  cpu=$(awk -v c=$((c1 - c0)) -v n="$n" -v t="$TICK" 'BEGIN {printf "%.1f", c / t * 1e6 / n}')
  kernel=$(awk -v a="$us0" -v b="$us1" -v k=$((k1 - k0)) -v n="$n" -v t="$TICK" 'BEGIN {
    split(a, x, " "); split(b, y, " ")
    printf "%.1f / %.1f; %.2f", (y[1] - x[1]) / t * 1e6 / n, (y[2] - x[2]) / t * 1e6 / n, k / n }')
  case $label in nginx*) NGINX_RUNS+=("$cpu") ;; esac
  [ -n "$spids" ] && scpu=$(awk -v c=$((s1 - s0)) -v n="$n" -v t="$TICK" 'BEGIN {printf "%.1f", c / t * 1e6 / n}')
  if [ -n "$split_of" ]; then
    threads "$split_of" >"$WORK/after"
    split=$(join -a 2 -e 0 -o 0,1.2,2.2 <(awk '{a[$1] += $2} END {for (k in a) print k, a[k]}' "$WORK/before" | sort) \
      <(awk '{a[$1] += $2} END {for (k in a) print k, a[k]}' "$WORK/after" | sort) |
      awk -v n="$n" -v t="$TICK" '$3 > $2 {printf "%s %.1f; ", $1, ($3 - $2) / t * 1e6 / n}')
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$rps" "$p99" "${non2xx:-0}" "$cpu" "${scpu:-}${split:+ ($split)}" "$kernel" >>"$ROWS_OUT"
}

# Prints the kept rows, each with its ratio to the mean of nginx's runs.
print_rows() {
  local mean
  mean=$(printf '%s\n' "${NGINX_RUNS[@]}" | awk '{s += $1} END {printf "%.2f", s / NR}')
  awk -F'\t' -v m="$mean" '{
    r = ($5 == "" ? "" : sprintf("%.2f", $5 / m))
    if ($5 == "") printf "| %s | | | | | | | |\n", $1
    else printf "| %s | %s | %s | %s | **%s** | %s | %s | %s |\n", $1, $2, $3, $4, $5, r, $7, $6
  }' "$ROWS_OUT"
  echo
  echo "× nginx: to the mean of nginx's two runs, ${NGINX_RUNS[*]} µs (first and last), $mean µs."
}

# Starts `idem serve` on PORT with STORE (and CONFIG, idem.toml unless given); sets GW.
start_idem() { # PORT STORE [CONFIG]
  IDEM_LOG=error $IDEM serve --listen "127.0.0.1:$1" --admin-listen "127.0.0.1:$(($1 + 100))" \
    --upstream "http://127.0.0.1:$UPSTREAM" --store "$2" --config "$WORK/${3:-idem.toml}" >/dev/null &
  GW=$!
  wait_port "$1"
  curl -s -o /dev/null -X POST "http://127.0.0.1:$1/v1/charges" -H 'Idempotency-Key: bench-replay' \
    -H 'Content-Type: application/json' -d "$BODY"
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

idem_rows() { # NAME PORT STORE SERVER_PIDS
  start_idem "$2" "$3"
  row "idem serve, $1, new keys" "$2" new.lua /v1/charges "$GW" "$4" "$GW"
  row "idem serve, $1, replays" "$2" same.lua /v1/charges "$GW" "$4" "$GW"
  stop "$GW"
}

# SQLite replays the completed-record cache does not hold: each is the store's claim.
uncached_rows() {
  { cat "$WORK/idem.toml"; printf '[limits]\ncache_bytes = 0\n'; } >"$WORK/idem-uncached.toml"
  start_idem 18311 "sqlite:$WORK/idem-uncached.db" idem-uncached.toml
  row "idem serve, SQLite, replays, no completed-record cache" 18311 same.lua /v1/charges "$GW" "" "$GW"
  stop "$GW"
}

# The floor under the forwarding path, in two steps: idem serve forwarding a POST that no
# route keys (the server, the proxy and the layer's admission, no store), and the bare hyper
# proxy of crates/idem-gateway/examples/bare_proxy.rs (the same server, threads and client,
# nothing of idem's), with hyper-util's pooled client as idem uses it and with connections
# the request drives itself.
floor_rows() {
  start_idem 18309 memory:
  row "idem serve, a POST no route keys (forwarded, no store)" 18309 pass.lua /v1/unkeyed "$GW" "" "$GW"
  stop "$GW"
  cargo build --release -q -p idem-gateway --example bare_proxy
  local mode pid
  for mode in pooled driven answer; do
    "${CARGO_TARGET_DIR:-target}/release/examples/bare_proxy" 127.0.0.1:18310 "$mode" "127.0.0.1:$UPSTREAM" "$(nproc)" &
    pid=$!
    wait_port 18310
    if [ "$mode" = answer ]; then
      row "bare hyper server answering itself (the floor under a replay)" 18310 same.lua /v1/charges "$pid" "" "$pid"
    else
      row "bare hyper proxy ($mode upstream connections)" 18310 pass.lua /v1/unkeyed "$pid" "" "$pid"
    fi
    stop "$pid"
  done
}

# The peer takes its upstream from an URL_ variable named in the path, and its settings from a
# .env file in its working directory.
peer_rows() { # NAME PORT REDIS_URL
  mkdir -p "$WORK/peer-$1"
  {
    echo "SERVER_ADDR=127.0.0.1:$2"
    echo "URL_CHARGES=http://127.0.0.1:$UPSTREAM/v1/charges"
    echo "LOG_LEVEL=error"
    [ -n "$3" ] && echo "REDIS_URL=$3"
  } >"$WORK/peer-$1/.env"
  (cd "$WORK/peer-$1" && exec "$PEER_BIN" >/dev/null 2>&1) &
  local pid=$!
  sleep 1
  export KEY_PREFIX="$PEER_PREFIX-"
  curl -s -o /dev/null -X POST "http://127.0.0.1:$2/URL_CHARGES" -H "idempotency-key: ${KEY_PREFIX}bench-replay" \
    -H 'Content-Type: application/json' -d "$BODY"
  local server=""
  [ -n "$3" ] && server=redis_pid
  row "idempotent-proxy, $1, new keys" "$2" new.lua /URL_CHARGES "$pid" "$server" ""
  row "idempotent-proxy, $1, replays" "$2" same.lua /URL_CHARGES "$pid" "$server" ""
  stop "$pid"
  unset KEY_PREFIX
}

echo "wrk -t2 -c$CONNS -d${DURATION}s per row, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), idem $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo '| row | requests/s | p99 | non-2xx | CPU µs/request | × nginx | user / system µs; preempted, per request | store server CPU µs/request (and the split by thread) |'
echo '|---|---:|---:|---:|---:|---:|---|---|'
# nginx's row comes first and last in every run: the mean of the two is the denominator.
nginx_row() { # LABEL
  row "$1" 18302 same.lua /v1/charges "$(pgrep -d ' ' -P "$(cat "$WORK/proxy/nginx.pid")")" "" ""
}
nginx_row "nginx reverse proxy (1 worker, keep-alive upstream)"
for r in $ROWS; do
  case $r in
    nginx) ;;
    memory) idem_rows memory 18303 memory: "" ;;
    floor) floor_rows ;;
    sqlite) idem_rows SQLite 18304 "sqlite:$WORK/idem.db" "" ;;
    uncached) uncached_rows ;;
    redis) idem_rows Redis 18305 "redis://127.0.0.1:6379/?prefix=$PREFIX&durability=volatile" redis_pid ;;
    postgres) idem_rows PostgreSQL 18306 "$PG?schema=$SCHEMA" postgres_pids ;;
    peer)
      if [ -n "${PEER_BIN:-}" ] && [ -x "$PEER_BIN" ]; then
        peer_rows memory 18307 ""
        peer_rows Redis 18308 "127.0.0.1:6379"
      else
        printf 'idempotent-proxy: skipped (PEER_BIN is not set to its built server)\t\t\t\t\t\n' >>"$ROWS_OUT"
      fi
      ;;
    *) echo "unknown row: $r" >&2; exit 2 ;;
  esac
done
nginx_row "nginx reverse proxy, again at the end"
print_rows
