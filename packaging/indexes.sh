# Package indexes on loopback that serve what packaging/build.py built, as a user's machine
# would meet them: pypiserver for the wheel and sdist, verdaccio (packaging/registry, pinned)
# for the npm tarballs, published there. Sourced by .ci/run; usable by hand:
#
#     source packaging/indexes.sh && start_indexes /tmp/work dist /tmp/pack-venv
#     ... $py_index, $npm_registry ...
#     stop_indexes
#
# Anything not built here (the frameworks, the MCP SDKs) is fetched from PyPI and npm through
# them: pypiserver redirects to PyPI, verdaccio proxies npm for every name but idem-runtime*.

_indexes_pids=()

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_http() {
  for _ in $(seq 100); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "no answer from $1" >&2
  return 1
}

# start_indexes WORK DIST PACK_VENV: sets py_index and npm_registry.
start_indexes() {
  local work=$1 dist=$2 venv=$3
  mkdir -p "$work/pypi" "$work/verdaccio"
  cp "$dist"/idem_runtime-*.whl "$dist"/idem_runtime-*.tar.gz "$work/pypi/"
  local py_port npm_port
  py_port=$(free_port)
  "$venv/bin/pypi-server" run -i 127.0.0.1 -p "$py_port" "$work/pypi" >"$work/pypiserver.log" 2>&1 &
  _indexes_pids+=($!)
  py_index="http://127.0.0.1:$py_port/simple/"
  wait_http "$py_index"

  npm_port=$(free_port)
  cat >"$work/verdaccio/config.yaml" <<YAML
storage: ./storage
# The platform package's tarball is about 12 MB; verdaccio's default bound is 10 MB.
max_body_size: 100mb
auth:
  htpasswd:
    file: ./htpasswd
uplinks:
  npmjs:
    url: https://registry.npmjs.org/
packages:
  'idem-runtime*':
    access: \$all
    publish: \$authenticated
  '**':
    access: \$all
    proxy: npmjs
log: { type: stdout, format: pretty, level: warn }
YAML
  (cd packaging/registry && npm ci --no-audit --no-fund --silent)
  packaging/registry/node_modules/.bin/verdaccio --config "$work/verdaccio/config.yaml" \
    --listen "127.0.0.1:$npm_port" >"$work/verdaccio.log" 2>&1 &
  _indexes_pids+=($!)
  npm_registry="http://127.0.0.1:$npm_port/"
  wait_http "${npm_registry}-/ping"
  # A publisher's account on this registry alone, and its token in a userconfig of its own.
  local token
  token=$(curl -fsS -X PUT -H 'content-type: application/json' \
    -d '{"name":"ci","password":"ci-publisher-pw"}' \
    "${npm_registry}-/user/org.couchdb.user:ci" | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')
  printf '//127.0.0.1:%s/:_authToken=%s\n' "$npm_port" "$token" >"$work/publish.npmrc"
  # The platform packages first: idem-runtime names them.
  local tgz
  for tgz in "$dist"/idem-runtime-*-*.tgz "$dist"/idem-runtime-[0-9]*.tgz; do
    npm publish --loglevel=warn --userconfig "$work/publish.npmrc" --registry "$npm_registry" "$tgz" >/dev/null
    echo "published $(basename "$tgz") to $npm_registry"
  done
}

stop_indexes() {
  local pid
  for pid in "${_indexes_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  _indexes_pids=()
}

# PATH less every directory holding cargo or rustc: what a user's machine without Rust has.
path_without_rust() {
  local out="" dir
  IFS=: read -ra dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    if [ -e "$dir/cargo" ] || [ -e "$dir/rustc" ]; then continue; fi
    out="${out:+$out:}$dir"
  done
  if PATH="$out" command -v cargo >/dev/null || PATH="$out" command -v rustc >/dev/null; then
    echo "cargo or rustc is still on PATH" >&2
    return 1
  fi
  # Where Rust came from the system's packages it shares a directory with everything else:
  # this machine cannot play one without Rust.
  local tool
  for tool in node npm python3; do
    if ! PATH="$out" command -v "$tool" >/dev/null; then
      echo "without the directories that hold cargo or rustc, PATH has no $tool: install Rust with rustup (~/.cargo/bin) to run these checks" >&2
      return 1
    fi
  done
  printf '%s\n' "$out"
}
