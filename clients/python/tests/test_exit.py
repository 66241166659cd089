"""A process that used a SQLite store and exits leaves the store as one complete file: the
package closes its stores at exit (atexit), so no -wal or -shm stays beside idem.db, and the
file alone answers the next process's replay."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from idem_runtime import idempotent, scope

    charges = []

    @idempotent(store=sys.argv[1], tool="charge_card")
    def charge_card(customer: str, amount_cents: int) -> dict:
        charges.append(customer)
        return {"charge": "ch_" + customer}

    with scope("order-123"):
        for customer in ("cus_1", "cus_2", "cus_1"):
            charge_card(customer=customer, amount_cents=4900)
    print(json.dumps({"charges": len(charges)}))
    """
)


class ExitLeavesOneFile(unittest.TestCase):
    def run_script(self, store: str) -> dict:
        p = subprocess.run(
            [sys.executable, "-c", SCRIPT, store],
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def test_a_sqlite_store_is_one_complete_file_after_exit(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "idem.db")
            self.assertEqual(self.run_script(f"sqlite:{path}"), {"charges": 2})
            self.assertEqual(sorted(os.listdir(tmp)), ["idem.db"])
            # The file alone, copied elsewhere, answers the replays.
            with tempfile.TemporaryDirectory() as other:
                copy = os.path.join(other, "idem.db")
                shutil.copy(path, copy)
                self.assertEqual(self.run_script(f"sqlite:{copy}"), {"charges": 0})


if __name__ == "__main__":
    unittest.main()
