#!/usr/bin/env bash
# The npm package's own test suite, run against the package as installed from the registry
# (PROJECT_DIR: what check_npm.sh installed): the tests are copied beside the installed files,
# which they import as `../index.js`, with the devDependencies they use at the versions
# clients/js/package.json pins. So the JavaScript, the native module and the binary under
# test are the ones a user gets, not the checkout's.
#
#     PATH=<no cargo> bash packaging/test_installed_js.sh PROJECT_DIR REGISTRY
set -euo pipefail
project=$1
registry=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
installed="$project/node_modules/idem-runtime"
test -f "$installed/index.js"

deps=$(node -e 'const p = require(process.argv[1]); console.log(Object.entries(p.devDependencies).map(([n, v]) => `${n}@${v}`).join(" "))' "$repo/clients/js/package.json")
# shellcheck disable=SC2086
(cd "$project" && npm install --no-save --no-audit --no-fund --silent --registry "$registry" $deps)
test -f "$project/node_modules/idem-runtime-linux-x64-gnu/idem_node.node"

cp -r "$repo/clients/js/tests" "$installed/"
cp "$repo"/clients/js/*.test.mjs "$installed/"
# Named one by one: the test runner skips files under node_modules when it searches a directory.
IDEM_REPO="$repo" node --test "$installed"/*.test.mjs "$installed"/tests/*.test.mjs
