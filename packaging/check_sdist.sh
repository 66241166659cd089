#!/usr/bin/env bash
# The sdist where no wheel fits, on a machine without Rust: pip must stop before any compiler
# runs, with the package's message naming the wheels that exist and what a source build needs
# (clients/python/build_backend/idem_build_backend.py), not maturin's or rustup's.
#
#     PATH=<no cargo> bash packaging/check_sdist.sh VENV_DIR INDEX_URL
set -euo pipefail
venv=$1
index=$2
python3 -m venv "$venv"
# The sdist only (--no-binary), from the loopback index; maturin for its build comes through
# the index's redirect to PyPI.
if out=$("$venv/bin/pip" install --disable-pip-version-check --index-url "$index" --no-binary idem-runtime idem-runtime 2>&1); then
  echo "idem-runtime installed from the sdist with no cargo on PATH: it should have stopped" >&2
  exit 1
fi
grep -q "no prebuilt wheel fits this machine" <<<"$out" || { echo "$out" >&2; exit 1; }
grep -q "wheels exist for Linux x86_64 with glibc >= 2.17" <<<"$out"
echo "the sdist without cargo, as a user sees it:"
grep -A3 "no prebuilt wheel fits" <<<"$out" | sed 's/^/  /'
