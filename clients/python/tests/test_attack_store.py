"""Adversarial: damaged records and unreachable stores. Nothing runs without a record, and a
damaged record gets an error that names what it is."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import unittest

from cli_support import subprocess_env

from idem_runtime import ResultUnreadableError, StoreUnavailableError, idempotent

CALL = """
import sys
from idem_runtime import idempotent
@idempotent(store=sys.argv[1], scope="sc", wait=0)
def f(x):
    print("RAN")
    return {"v": x}
try:
    f(1)
except Exception as e:
    print(type(e).__name__, e)
"""


class DamagedRecords(unittest.TestCase):
    def call(self, url: str) -> str:
        # One process per call: the store (and its SQLite connection) is cached per process.
        done = subprocess.run(
            [sys.executable, "-c", CALL, url],
            capture_output=True, text=True, env=subprocess_env(), timeout=120,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout.strip()

    def test_a_completed_record_without_its_result_is_unreadable_not_too_large(self):
        path = os.path.join(tempfile.mkdtemp(), "c.db")
        url = "sqlite:" + path
        self.assertEqual(self.call(url), "RAN")
        with sqlite3.connect(path) as db:
            db.execute("UPDATE idem_records SET response = NULL")
        out = self.call(url)
        self.assertNotIn("RAN", out)
        self.assertTrue(out.startswith(ResultUnreadableError.__name__), out)


class UnreachableStores(unittest.TestCase):
    def test_nothing_runs_without_a_store(self):
        for url in (
            "redis://127.0.0.1:1?durability=volatile",
            "postgres://postgres@127.0.0.1:1/test",
            "sqlite:/nonexistent-dir/idem.db",
        ):
            ran = []

            @idempotent(store=url, scope="sc")
            def f(x):
                ran.append(x)

            with self.subTest(url=url), self.assertRaises(StoreUnavailableError):
                f(1)
            self.assertEqual(ran, [])


if __name__ == "__main__":
    unittest.main()
