"""Adversarial: more duplicates of one call in flight, in one event loop, than the loop's
default executor has threads. Each waiting duplicate holds an executor thread; the first
call's finish was queued behind them, so it could not store its result until their ``wait``
ran out, and every one of them failed with ``InFlightError``."""

from __future__ import annotations

import asyncio
import os
import unittest
import uuid

from idem_runtime import idempotent


class ManyWaitingDuplicates(unittest.TestCase):
    def test_duplicates_beyond_the_executor_size_all_get_the_result(self):
        ran = []
        workers = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default

        @idempotent(store="memory:", scope="t" + uuid.uuid4().hex, wait=20)
        async def op(x: int) -> int:
            ran.append(x)
            await asyncio.sleep(0.2)
            return x

        async def main():
            first = asyncio.create_task(op(1))
            await asyncio.sleep(0.05)  # the first call is running
            duplicates = [asyncio.create_task(op(1)) for _ in range(workers + 4)]
            return await asyncio.gather(first, *duplicates, return_exceptions=True)

        results = asyncio.run(main())
        self.assertEqual(ran, [1])
        self.assertEqual([r for r in results if r != 1], [])


if __name__ == "__main__":
    unittest.main()
