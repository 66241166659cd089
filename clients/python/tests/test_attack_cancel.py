"""Adversarial: an asyncio caller cancelled while its claim is in flight in the worker thread.

A duplicate waits (``wait``) for the call in flight; the first call raises, which releases the
key, and the waiting duplicate's claim then succeeds in its thread. If that duplicate was
cancelled meanwhile (a framework's tool timeout), the ticket it won must be released: the
function never ran. Dropped, the key read as in flight for the lease and then as an unknown
outcome, so every retry of an intent that never ran raised."""

from __future__ import annotations

import asyncio
import threading
import unittest
import uuid

from idem_runtime import idempotent


class CancelledDuplicate(unittest.TestCase):
    def test_a_cancelled_waiting_duplicate_does_not_strand_the_key(self):
        calls = []
        started = threading.Event()

        @idempotent(store="memory:", scope="t" + uuid.uuid4().hex, wait=10, lease=30)
        async def op(x: int) -> int:
            calls.append(x)
            if len(calls) == 1:
                started.set()
                await asyncio.sleep(0.3)
                raise ConnectionError("refused before acting: releases the key")
            return x

        async def main():
            first = asyncio.create_task(op(1))
            while not started.is_set():
                await asyncio.sleep(0.01)
            duplicate = asyncio.create_task(op(1))
            await asyncio.sleep(0.1)  # the duplicate is now waiting in its thread
            duplicate.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await duplicate
            with self.assertRaises(ConnectionError):
                await first
            # The retry must run the function (it never ran successfully), with wait=0 so a
            # stranded claim shows as InFlightError at once instead of after the wait.
            for _ in range(1000):
                try:
                    return await retry(1)
                except Exception as e:  # noqa: BLE001 - the claim's release may still run
                    last = e
                    await asyncio.sleep(0.01)
            raise last

        @idempotent(store="memory:", scope=op.idem_tool.scope, tool="op", wait=0)
        async def retry(x: int) -> int:
            calls.append(x)
            return x

        self.assertEqual(asyncio.run(main()), 1)


if __name__ == "__main__":
    unittest.main()
