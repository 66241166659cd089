"""What the framework tests of this directory share: a SQLite store of the test's own, and the
record the real `idem inspect` reads from it."""

import json
import pathlib
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from test_mcp_proxy import idem_binary, missing_for  # noqa: E402,F401  (one place finds the CLI)


class StoreTest(unittest.TestCase):
    """A test with ``self.store``, a SQLite store in a directory removed afterwards."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.store = f"sqlite:{pathlib.Path(self.dir.name) / 'idem.db'}"

    def inspect_cli(self, key):
        """``idem inspect KEY --json`` on the test's store, as an operator runs it."""
        out = subprocess.run([str(idem_binary()), "inspect", key, "--store", self.store, "--json"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)
