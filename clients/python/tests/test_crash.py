"""A Python process SIGKILLed mid-tool: what it leaves in the store, what `idem inspect`
shows, what the decorator answers in a new process, and how `idem resolve` settles it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from cli_support import cli_missing, idem, need, subprocess_env

# The tool of the crashed process, and of the process that retries it. Its effect is a row in
# a SQLite table of the test's own (not idem's store); with BLOCK set it then waits forever,
# so the test can kill it mid-call.
TOOL = textwrap.dedent(
    """
    import json, os, sqlite3, sys, threading
    from idem_runtime import IdemError, idempotent, scope

    store, effects, order = sys.argv[1], sys.argv[2], sys.argv[3]

    @idempotent(store=store, lease=1, tool="ship")
    def ship(order: str) -> dict:
        db = sqlite3.connect(effects)
        db.execute("INSERT INTO shipped (order_id) VALUES (?)", (order,))
        db.commit()
        db.close()
        if os.environ.get("BLOCK"):
            print(json.dumps({"effect": "started"}), flush=True)
            threading.Event().wait()
        return {"shipped": order, "by": os.getpid()}

    with scope("run-crash"):
        try:
            value, outcome = ship.call_with_outcome(order)
            print(json.dumps({"value": value, "key": outcome.key, "replayed": outcome.replayed}))
        except IdemError as e:
            print(json.dumps({"error": type(e).__name__, "message": str(e), "key": e.key}))
    """
)


@need(cli_missing())
class Crash(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.store = f"sqlite:{self.tmp.name}/idem.db"
        self.effects = os.path.join(self.tmp.name, "effects.db")
        db = sqlite3.connect(self.effects)
        db.execute("CREATE TABLE shipped (order_id TEXT)")
        db.commit()
        db.close()

    def tearDown(self):
        self.tmp.cleanup()

    def rows(self, order: str) -> int:
        db = sqlite3.connect(self.effects)
        try:
            return db.execute("SELECT COUNT(*) FROM shipped WHERE order_id = ?", (order,)).fetchone()[0]
        finally:
            db.close()

    def call(self, order: str) -> dict:
        p = subprocess.run(
            [sys.executable, "-c", TOOL, self.store, self.effects, order],
            capture_output=True, text=True, env=subprocess_env(), timeout=120,
        )
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def inspect(self, key: str) -> dict:
        return json.loads(idem("inspect", key, "--store", self.store, "--json").stdout)

    def crash(self, order: str) -> str:
        """Runs the tool until its effect landed, SIGKILLs it, and waits out the lease."""
        env = dict(subprocess_env(), BLOCK="1")
        child = subprocess.Popen(
            [sys.executable, "-c", TOOL, self.store, self.effects, order],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        try:
            line = child.stdout.readline()
            self.assertEqual(json.loads(line), {"effect": "started"}, child.stderr.read() if not line else "")
            from idem_runtime import derive_key

            key = derive_key("run-crash", "ship", {"order": order})
            self.assertEqual(self.inspect(key)["state"], "in_flight")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
            child.stderr.close()
        # The heartbeat died with the process: the lease (1 s) runs out. Polled, not timed.
        deadline = time.monotonic() + 60
        while self.inspect(key)["state"] != "abandoned":
            self.assertLess(time.monotonic(), deadline, "the record never read as abandoned")
            time.sleep(0.2)
        return key

    def test_sigkill_mid_tool_then_resolve_with_its_result(self):
        key = self.crash("o-1")
        self.assertEqual(self.rows("o-1"), 1)
        text = idem("inspect", key, "--store", self.store).stdout
        self.assertIn(key, text)
        self.assertIn("abandoned", text)

        # A new process: the outcome is unknown, so the tool is not run again.
        answer = self.call("o-1")
        self.assertEqual(answer["error"], "OutcomeUnknownError")
        self.assertEqual(answer["key"], key)
        self.assertIn(f"idem resolve {key} --store {self.store}", answer["message"])
        self.assertEqual(self.rows("o-1"), 1)

        # The operator checked: it shipped. Its result is recorded and replayed from now on.
        body = os.path.join(self.tmp.name, "body.json")
        with open(body, "w") as f:
            json.dump({"shipped": "o-1", "by": "operator"}, f)
        idem("resolve", key, "--store", self.store, "--status", "200", "--body", body)
        self.assertEqual(self.inspect(key)["state"], "completed")
        answer = self.call("o-1")
        self.assertEqual(answer, {"value": {"shipped": "o-1", "by": "operator"}, "key": key, "replayed": True})
        self.assertEqual(self.rows("o-1"), 1)

    def test_sigkill_mid_tool_then_release(self):
        key = self.crash("o-2")
        self.assertEqual(self.call("o-2")["error"], "OutcomeUnknownError")
        # The operator checked: it did not happen. Released, the next call runs it.
        idem("resolve", key, "--store", self.store, "--release")
        answer = self.call("o-2")
        self.assertEqual((answer["value"]["shipped"], answer["replayed"]), ("o-2", False))
        self.assertEqual(self.rows("o-2"), 2)
        self.assertTrue(self.call("o-2")["replayed"])
        self.assertEqual(self.inspect(key)["state"], "completed")


if __name__ == "__main__":
    unittest.main()
