# Sourced by the gateway benchmarks: which idem binary to measure, and nginx as the upstream
# (and as the plain reverse proxy idem is compared with).

# Sets IDEM: $IDEM_BIN when given (another build's binary, for a before/after comparison),
# otherwise this tree's release build.
idem_binary() {
  if [ -n "${IDEM_BIN:-}" ]; then
    IDEM=$IDEM_BIN
  else
    cargo build --release -q -p idem-cli
    IDEM=${CARGO_TARGET_DIR:-target}/release/idem
  fi
}

# Starts nginx with its files in WORK: an upstream on 127.0.0.1:UPSTREAM_PORT answering 201
# with a small JSON body (so it is never the bottleneck), and a plain keep-alive reverse proxy
# to it on 127.0.0.1:PROXY_PORT. Stop it with `nginx -p WORK -c nginx.conf -s stop`.
start_nginx() { # WORK UPSTREAM_PORT PROXY_PORT
  mkdir -p "$1/logs"
  cat > "$1/nginx.conf" <<NGINX
worker_processes 1;
pid $1/nginx.pid;
error_log $1/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $1/body;
  proxy_temp_path $1/proxy;
  upstream app { server 127.0.0.1:$2; keepalive 128; }
  server {
    listen 127.0.0.1:$2;
    location / { default_type application/json; return 201 '{"charge_id":"ch_1","amount_cents":4900}'; }
  }
  server {
    listen 127.0.0.1:$3;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
  nginx -p "$1" -c nginx.conf
}

# Writes into WORK what the gateway and the load generator share: idem.toml (one route that
# requires a key; wrk sends no credentials, so anonymous callers are allowed), and two wrk
# scripts posting the same charge body to the URL's path: new.lua with a fresh Idempotency-Key
# per request, same.lua with one key throughout (replays, once the first has run); both keys
# start with $KEY_PREFIX when set (a peer that keeps keys as given, in a shared Redis). Sets BODY.
write_load() { # WORK
  cat > "$1/idem.toml" <<TOML
anonymous = "allow"   # wrk sends no credentials
[[routes]]
method = "POST"
path = "/v1/charges"
require_key = true
TOML
  BODY='{"customer_id":"cus_8g2k","amount_cents":4900}'
  cat > "$1/new.lua" <<LUA
local n = 0
function setup(thread) n = n + 1; thread:set("tid", n) end
local counter = 0
local run = (os.getenv("KEY_PREFIX") or "") .. tostring(os.time()) .. "-" .. tostring(math.random(1000000))
request = function()
  counter = counter + 1
  return wrk.format("POST", wrk.path,
    {["Idempotency-Key"] = run .. "-" .. tid .. "-" .. counter, ["Content-Type"] = "application/json"},
    '$BODY')
end
LUA
  cat > "$1/same.lua" <<LUA
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = (os.getenv("KEY_PREFIX") or "") .. "bench-replay"
LUA
}
