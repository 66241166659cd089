"""Adversarial: more duplicates of one call in flight, in one event loop, than the loop's
default executor has threads. Each waiting duplicate held an executor thread; the first
call's finish was queued behind them, so it could not store its result until their ``wait``
ran out, and every one of them failed with ``InFlightError``. A finish now runs on a thread
of its own (``_decorator._settle``), so the waiting duplicates cannot queue it; these check it
on a store without I/O and on Redis, and that two event loops in two threads each get their
own answers."""

from __future__ import annotations

import asyncio
import os
import threading
import unittest
import uuid

from idem_runtime import idempotent


REDIS = "redis://127.0.0.1:6379/0?durability=volatile&prefix=idem-py-attack-executor"


class ManyWaitingDuplicates(unittest.TestCase):
    def test_duplicates_beyond_the_executor_size_all_get_the_result(self):
        for store in ("memory:", REDIS):
            with self.subTest(store=store):
                self.duplicates_all_get_the_result(store)

    def duplicates_all_get_the_result(self, store: str) -> None:
        ran = []
        workers = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default

        @idempotent(store=store, scope="t" + uuid.uuid4().hex, wait=20)
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

    def test_two_loops_in_two_threads_each_get_their_own_answers(self):
        scope = "t" + uuid.uuid4().hex

        @idempotent(store=REDIS, scope=scope)
        async def double(x: int) -> int:
            await asyncio.sleep(0)
            return 2 * x

        async def calls(base: int):
            # New keys, then each again (replays), interleaved with the other loop's.
            firsts = await asyncio.gather(*(double(base + i) for i in range(50)))
            again = await asyncio.gather(*(double(base + i) for i in range(50)))
            return firsts, again

        results = {}

        def run(base: int) -> None:
            results[base] = asyncio.run(calls(base))

        threads = [threading.Thread(target=run, args=(b,)) for b in (0, 1000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for base in (0, 1000):
            expected = [2 * (base + i) for i in range(50)]
            self.assertEqual(results[base], (expected, expected))


if __name__ == "__main__":
    unittest.main()
