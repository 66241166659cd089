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


# A coroutine function's call that ran and is finishing when the program ends: its result
# is encoded (slowly) and stored on the settle pool's thread, which the interpreter waits for.
ASYNC_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from idem_runtime import idempotent, scope
    from idem_runtime._codec import JSON

    import threading

    finishing = threading.Event()

    class Slow:
        media_type = JSON.media_type

        def encode(self, value):
            finishing.set()
            time.sleep(0.5)
            return JSON.encode(value)

        def decode(self, data):
            return JSON.decode(data)

    runs = []

    @idempotent(store=sys.argv[1], tool="ship", codec=Slow())
    async def ship(order: str) -> dict:
        runs.append(order)
        return {"shipped": order}

    async def main():
        with scope("exit-async"):
            if sys.argv[2] == "leave":
                asyncio.get_running_loop().create_task(ship(order="o1"))
                # Until the call ran and its finish is under way, however slow the machine.
                while not finishing.is_set():
                    await asyncio.sleep(0.01)
            else:
                print(json.dumps({"answer": await ship(order="o1"), "runs": len(runs)}))

    asyncio.run(main())
    """
)


class ExitLeavesOneFile(unittest.TestCase):
    def run_script(self, script: str, *args: str) -> str:
        """``script`` in a process of its own; what it printed, once it exited 0."""
        p = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def test_a_sqlite_store_is_one_complete_file_after_exit(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "idem.db")
            self.assertEqual(json.loads(self.run_script(SCRIPT, f"sqlite:{path}")), {"charges": 2})
            self.assertEqual(sorted(os.listdir(tmp)), ["idem.db"])
            # The file alone, copied elsewhere, answers the replays.
            with tempfile.TemporaryDirectory() as other:
                copy = os.path.join(other, "idem.db")
                shutil.copy(path, copy)
                self.assertEqual(json.loads(self.run_script(SCRIPT, f"sqlite:{copy}")), {"charges": 0})


    def test_a_coroutines_finish_under_way_at_exit_is_kept(self):
        """asyncio.run cancels the task that awaits the finish, and the loop closes; the
        finish itself goes on, on the settle pool, and the interpreter waits for it: the next
        process replays instead of meeting an unknown outcome."""
        with tempfile.TemporaryDirectory() as tmp:
            store = f"sqlite:{os.path.join(tmp, 'idem.db')}"
            self.run_script(ASYNC_SCRIPT, store, "leave")
            again = json.loads(self.run_script(ASYNC_SCRIPT, store, "again"))
            self.assertEqual(again, {"answer": {"shipped": "o1"}, "runs": 0})


if __name__ == "__main__":
    unittest.main()
