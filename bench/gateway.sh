#!/usr/bin/env bash
# Gateway throughput and latency, every configuration in one run on this machine:
#   direct upstream | nginx as a plain reverse proxy | idem serve (memory, sqlite) x (new keys, replays)
# The upstream is nginx answering 201 with a small JSON body, so it is never the bottleneck.
# Needs wrk and nginx (Debian: apt-get install wrk nginx). Loopback only; bounded by DURATION.
#
#   bash bench/gateway.sh [DURATION_SECONDS=10] [CONNECTIONS=32]
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-10}
CONNS=${2:-32}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; nginx -p "$WORK" -c nginx.conf -s stop 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT

cargo build --release -q -p idem-cli
IDEM=target/release/idem

mkdir -p "$WORK/logs"
cat > "$WORK/nginx.conf" <<NGINX
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/body;
  proxy_temp_path $WORK/proxy;
  upstream app { server 127.0.0.1:18001; keepalive 128; }
  server {
    listen 127.0.0.1:18001;
    location / { default_type application/json; return 201 '{"charge_id":"ch_1","amount_cents":4900}'; }
  }
  server {
    listen 127.0.0.1:18002;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
nginx -p "$WORK" -c nginx.conf

cat > "$WORK/idem.toml" <<TOML
[[routes]]
method = "POST"
path = "/v1/charges"
require_key = true
TOML
IDEM_LOG=error $IDEM serve --listen 127.0.0.1:18003 --admin-listen 127.0.0.1:18013 --upstream http://127.0.0.1:18001 --store memory: --config "$WORK/idem.toml" >/dev/null &
IDEM_LOG=error $IDEM serve --listen 127.0.0.1:18004 --admin-listen 127.0.0.1:18014 --upstream http://127.0.0.1:18001 --store "sqlite:$WORK/idem.db" --config "$WORK/idem.toml" >/dev/null &
sleep 1

BODY='{"customer_id":"cus_8g2k","amount_cents":4900}'
cat > "$WORK/new.lua" <<LUA
local n = 0
function setup(thread) n = n + 1; thread:set("tid", n) end
local counter = 0
local run = tostring(os.time())
request = function()
  counter = counter + 1
  return wrk.format("POST", "/v1/charges",
    {["Idempotency-Key"] = run .. "-" .. tid .. "-" .. counter, ["Content-Type"] = "application/json"},
    '$BODY')
end
LUA
cat > "$WORK/same.lua" <<LUA
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "bench-replay"
LUA
for port in 18003 18004; do
  curl -s -o /dev/null -X POST "http://127.0.0.1:$port/v1/charges" -H 'Idempotency-Key: bench-replay' -H 'Content-Type: application/json' -d "$BODY"
done

run() { # label port script
  local out
  out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$WORK/$3" "http://127.0.0.1:$2/v1/charges")
  local rps p50 p99 non2xx
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  printf '| %s | %s | %s | %s | %s |\n' "$1" "$rps" "$p50" "$p99" "${non2xx:-0}"
}

echo "wrk -t2 -c$CONNS -d${DURATION}s, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo '| path | requests/s | p50 | p99 | non-2xx |'
echo '|---|---:|---:|---:|---:|'
run "direct upstream (nginx return 201)" 18001 same.lua
run "nginx reverse proxy (plain, keepalive)" 18002 same.lua
run "idem serve, memory, new keys" 18003 new.lua
run "idem serve, memory, replays" 18003 same.lua
run "idem serve, sqlite, new keys" 18004 new.lua
run "idem serve, sqlite, replays" 18004 same.lua
