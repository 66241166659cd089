"""What the agent-framework tests share: a payment whose effect is a row in a SQLite table of
the test's own (not idem's store), and the store, both in a temporary directory."""

from __future__ import annotations

import os
import pathlib
import sqlite3
import subprocess
import sys
import tempfile
import unittest

import cli_support


class Payments:
    """``charge(customer, amount_cents)`` adds a row; ``rows()`` counts them."""

    def __init__(self, test: unittest.TestCase) -> None:
        tmp = tempfile.TemporaryDirectory(prefix="idem-agents-")
        test.addCleanup(tmp.cleanup)
        self.dir = pathlib.Path(tmp.name)
        self.store = f"sqlite:{self.dir / 'idem.db'}"
        self.db = self.dir / "payments.db"
        with sqlite3.connect(self.db) as db:
            db.execute("CREATE TABLE charges (customer TEXT, amount_cents INTEGER)")

    def charge(self, customer: str, amount_cents: int) -> dict:
        with sqlite3.connect(self.db) as db:
            cur = db.execute("INSERT INTO charges VALUES (?, ?)", (customer, amount_cents))
            return {"charge": f"ch_{cur.lastrowid}", "amount_cents": amount_cents}

    def rows(self) -> int:
        with sqlite3.connect(self.db) as db:
            return db.execute("SELECT COUNT(*) FROM charges").fetchone()[0]

    def inspect(self, key: str) -> str:
        """``idem inspect KEY --store ...``, the CLI, on this test's store."""
        return cli_support.idem("inspect", key, "--store", self.store).stdout


def lost_answer() -> Exception:
    """The error a caller sees when the tool acted and stored its result, but the answer did
    not come back (a connection dropped, a deadline passed)."""
    return TimeoutError("timed out waiting for the tool's answer (it may have run)")


def run_example(name: str) -> subprocess.CompletedProcess:
    """Runs ``examples/agents/NAME`` as a user runs it, with this interpreter and the
    idem_runtime this test imports."""
    example = pathlib.Path(__file__).resolve().parents[3] / "examples" / "agents" / name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=300, env=env)
