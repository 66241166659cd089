"""Per-call time and CPU of an ``async def`` under ``@idempotent``: new keys, then replays of
one, called one after another on one event loop. A benchmark, not a test: numbers go in
docs/benchmarks.md ("Python package").

    python clients/python/bench/bench_async.py STORE_URL [CALLS]

The CPU is this process's (``time.process_time``: every thread, idem's runtime among them).
"""

import asyncio
import sys
import time
import uuid

from idem_runtime import idempotent, scope

url = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000


@idempotent(store=url, tool="ship")
async def body(order):
    return {"order": order["id"], "status": "shipped"}


async def main():
    with scope("a-" + uuid.uuid4().hex[:6]):
        await body(order={"id": "warm"})
        for kind in ("new", "replay"):
            c0, t0 = time.process_time(), time.perf_counter()
            for i in range(n):
                await body(order={"id": f"o{i}" if kind == "new" else "warm"})
            wall, cpu = (time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6
            print(f"{kind}: {wall:.1f} us per call, CPU {cpu:.1f} us")


asyncio.run(main())
