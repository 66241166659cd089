"""What the tests share: the `idem` CLI binary, the package on the path, and the rule that a
test needing a missing service fails under IDEM_REQUIRE_SERVICES=1 (as in CI)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import unittest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
PACKAGE = HERE.parent / "python"
REQUIRED = os.environ.get("IDEM_REQUIRE_SERVICES") == "1"

# The package's source tree is tested in place when its native module was built there
# (`maturin develop`); otherwise (CI: `pip install ./clients/python`) the installed package is.
_built_in_place = any((PACKAGE / "idem_runtime").glob("_native*.so")) or any(
    (PACKAGE / "idem_runtime").glob("_native*.pyd")
)
if _built_in_place and str(PACKAGE) not in sys.path and os.environ.get("IDEM_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(PACKAGE))


def idem_binary() -> pathlib.Path:
    """$IDEM_BIN, else target/debug/idem under $CARGO_TARGET_DIR or the repository."""
    if os.environ.get("IDEM_BIN"):
        return pathlib.Path(os.environ["IDEM_BIN"])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    return target / "debug" / "idem"


def need(why_missing):
    """A skip decorator when ``why_missing`` is set; under IDEM_REQUIRE_SERVICES=1 the test
    fails with the reason instead."""
    if not why_missing:
        return lambda f: f
    if REQUIRED:

        def fail(f):
            def test(self):
                self.fail(f"IDEM_REQUIRE_SERVICES=1 but {why_missing}")

            test.__name__ = f.__name__
            return test

        return fail
    return unittest.skip(why_missing)


def cli_missing():
    b = idem_binary()
    return None if b.is_file() else f"no idem binary at {b} (cargo build -p idem-cli, or set IDEM_BIN)"


def idem(*args: str, env=None, check=True) -> subprocess.CompletedProcess:
    """Runs the idem CLI; output as text."""
    p = subprocess.run(
        [str(idem_binary()), *args], capture_output=True, text=True, env=env, timeout=60
    )
    if check and p.returncode != 0:
        raise AssertionError(f"idem {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def subprocess_env() -> dict:
    """The environment for a child Python that imports this checkout's package."""
    env = dict(os.environ)
    if _built_in_place and os.environ.get("IDEM_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = os.pathsep.join(
            [str(PACKAGE), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env
