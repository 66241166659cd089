#!/usr/bin/env bash
# The sdist where no wheel fits, on a machine without Rust: pip must stop before any compiler
# runs, with the package's message naming the wheels that exist and what a source build needs
# (clients/python/build_backend/idem_build_backend.py), not maturin's or rustup's.
#
#     PATH=<no cargo> bash packaging/check_sdist.sh VENV_DIR INDEX_URL SDIST
set -euo pipefail
venv=$1
index=$2
sdist=$3
python3 -m venv "$venv"
# The sdist only (--no-binary), from the loopback index; maturin for its build comes through
# the index's redirect to PyPI.
if out=$("$venv/bin/pip" install --disable-pip-version-check --index-url "$index" --no-binary idem-runtime idem-runtime 2>&1); then
  echo "idem-runtime installed from the sdist with no cargo on PATH: it should have stopped" >&2
  exit 1
fi
# This machine is one the wheel covers: the message says pip was kept from using it.
grep -q "the prebuilt wheel fits this machine" <<<"$out" || { echo "$out" >&2; exit 1; }
grep -q "needs Rust's cargo on PATH" <<<"$out"
echo "the sdist without cargo, as a user sees it:"
grep -A1 "idem-runtime: pip is building" <<<"$out" | sed 's/^ */  /'

# A machine no wheel covers, as the backend sees it (the same check, its platform forced).
mkdir -p "$venv/sdist"
tar -xzf "$sdist" -C "$venv/sdist"
if other=$(cd "$venv"/sdist/idem_runtime-*/build_backend && python3 -c '
import platform, sys
platform.machine = lambda: "aarch64"
sys.modules["maturin"] = type(sys)("maturin")  # the backend wraps maturin; its hooks are not called here
for hook in ("build_editable", "get_requires_for_build_editable", "get_requires_for_build_wheel", "build_wheel", "prepare_metadata_for_build_wheel"):
    setattr(sys.modules["maturin"], hook, None)
import idem_build_backend
idem_build_backend.get_requires_for_build_wheel()
' 2>&1); then
  echo "the backend went on without cargo on a machine no wheel covers" >&2
  exit 1
fi
grep -q "no prebuilt wheel fits this machine (Linux aarch64, .*wheels exist for Linux x86_64 with glibc >= 2.17" <<<"$other" || { echo "$other" >&2; exit 1; }
echo "on a machine no wheel covers: $(grep -o 'no prebuilt wheel fits.*CPython >= 3.9' <<<"$other")"
