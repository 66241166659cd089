#!/usr/bin/env bash
# The npm packages as a user without Rust meets them: `npm install idem-runtime` from REGISTRY
# (packaging/indexes.sh) into an empty project, which must pick the platform package through
# optionalDependencies, and then everything the package promises, run from that project.
#
#     PATH=<no cargo> bash packaging/check_npm.sh PROJECT_DIR REGISTRY
set -euo pipefail
project=$1
registry=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
version=$(python3 -c 'import tomllib; print(tomllib.load(open("'"$repo"'/Cargo.toml", "rb"))["workspace"]["package"]["version"])')
sdk=$(python3 -c 'import json; print(json.load(open("'"$repo"'/clients/js/package-lock.json"))["packages"]["node_modules/@modelcontextprotocol/sdk"]["version"])')

if command -v cargo >/dev/null || command -v rustc >/dev/null; then
  echo "check_npm.sh runs with no Rust on PATH" >&2
  exit 1
fi
mkdir -p "$project"
cd "$project"
npm init -y >/dev/null
npm pkg set type=module >/dev/null
started=$SECONDS
npm install --no-audit --no-fund --registry "$registry" "idem-runtime@$version" "@modelcontextprotocol/sdk@$sdk"
echo "npm install idem-runtime (from the loopback registry, with the MCP SDK): $((SECONDS - started)) s"
test -f "node_modules/idem-runtime-linux-x64-gnu/idem_node.node"
test ! -e "node_modules/idem-runtime/idem_node.node"

cp "$repo/clients/js/scripts/smoke-installed.mjs" .
node smoke-installed.mjs

got=$(npx --no-install idem-runtime --version)
[ "$got" = "idem $version" ] || { echo "npx idem-runtime --version said '$got', not 'idem $version'" >&2; exit 1; }
[ "$(npx --no-install idem --version)" = "idem $version" ]
npx --no-install idem-runtime demo --intents 20 --dir "$project/demo" | sed -n '1,12p'

# A machine with no prebuilt package: one message naming the built platforms and the source build.
if out=$(IDEM_RUNTIME_PLATFORM=darwin-arm64 node -e 'await import("idem-runtime")' --input-type=module 2>&1); then
  echo "idem-runtime loaded on a platform it has no package for" >&2
  exit 1
fi
grep -q "no prebuilt package exists for darwin-arm64; prebuilt: linux-x64-gnu" <<<"$out" || { echo "$out" >&2; exit 1; }
grep -q "cargo build --release -p idem-cli" <<<"$out"
echo "unsupported platform, as a user sees it: $(grep -o 'idem-runtime: .*prebuilt: [a-z0-9-]*' <<<"$out")"

# A binary cut short (a disk filled while unpacking): named, with its path, not run.
bin=node_modules/idem-runtime-linux-x64-gnu/bin/idem
cp "$bin" "$project/idem.saved"
head -c 100000 "$project/idem.saved" >"$bin"
if out=$(npx --no-install idem-runtime --version 2>&1); then
  echo "a truncated binary ran: $out" >&2
  exit 1
fi
grep -q "$project/node_modules/idem-runtime-linux-x64-gnu/bin/idem cannot be run (100000 bytes where the package has" <<<"$out" || { echo "$out" >&2; exit 1; }
echo "damaged binary, as a user sees it: $out"
cp "$project/idem.saved" "$bin"

node "$repo/packaging/smoke_mcp.mjs" "$project" "$project/$bin"

# The MCP Inspector's CLI (0.15.0, the last that runs on Node 20) launching the proxy as its
# docs show a server: it drops a `--`, so the upstream goes in --upstream-cmd.
npm install --no-audit --no-fund --silent --registry "$registry" @modelcontextprotocol/inspector@0.15.0
inspector_dir="$project/inspector"
mkdir -p "$inspector_dir"
for expected in "false ch_1" "true ch_1"; do
  out=$(npx --no-install mcp-inspector --cli npx --no-install idem-runtime mcp --store "sqlite:$inspector_dir/idem.db" \
    --upstream-cmd "$project/$bin example-mcp --db $inspector_dir/charges.db" \
    --method tools/call --tool-name charge_card --tool-arg customer=cus_1 --tool-arg amount_cents=4900 \
    --tool-arg idempotency_key=inspector-1)
  got=$(node -e 'const r = JSON.parse(require("fs").readFileSync(0, "utf8")); process.stdout.write(`${r._meta?.idem?.replayed === true} ${r.structuredContent?.charge_id}`)' <<<"$out")
  [ "$got" = "$expected" ] || { echo "the Inspector's call answered '$got', not '$expected': $out" >&2; exit 1; }
done
echo "the MCP Inspector CLI through npx idem-runtime mcp --upstream-cmd: a charge, then its replay"
