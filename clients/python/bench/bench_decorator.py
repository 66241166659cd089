"""Per-call overhead of @idempotent (new keys and replays) on memory:, SQLite and Redis, side
by side with AWS Lambda Powertools' ``idempotent_function`` on its Redis persistence layer
and with an undecorated call. A benchmark, not a test: numbers go in docs/benchmarks.md.

    pip install 'aws-lambda-powertools[redis]==3.37.0' redis==8.1.0 boto3==1.42.9
    python clients/python/bench/bench_decorator.py [--calls 5000] [--rounds 5]

Every case calls a function of one dict argument, as Powertools requires
(``data_keyword_argument``); a new key is a new ``order`` id, a replay repeats one. Each
case reports the best round's mean (the least disturbed by other work on the machine).

Beside the time per call, each row gives the CPU per call: this process's (every thread:
idem's runtime workers count, as Powertools' calling thread does) and, on Redis, the Redis
server's (its ``/proc`` ticks, when it runs on this machine). A wall-clock rate on a shared
2-core machine moves with the machine; CPU per call moves much less.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pathlib
import platform
import sys
import tempfile
import time
import uuid
import warnings

HERE = pathlib.Path(__file__).resolve().parent
if os.environ.get("IDEM_BENCH_INSTALLED") != "1":
    sys.path.insert(0, str(HERE.parent / "python"))

import idem_runtime  # noqa: E402
from idem_runtime import idempotent, scope  # noqa: E402


def body(order: dict) -> dict:
    return {"order": order["id"], "status": "shipped"}


def server_cpu_seconds(pid: int | None) -> float:
    """User + system CPU the process ``pid`` has used so far (0 when it is not local)."""
    if pid is None:
        return 0.0
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def best_mean(fn, make_arg, calls: int, rounds: int, server: int | None = None):
    """Seconds per call (the best of ``rounds`` rounds of ``calls`` calls), and the CPU
    seconds per call of this process and of ``server`` in that best round."""
    best = (float("inf"), 0.0, 0.0)
    for _ in range(rounds):
        args = [make_arg() for _ in range(calls)]
        s0, c0, t = server_cpu_seconds(server), time.process_time(), time.perf_counter()
        for a in args:
            fn(order=a)
        wall = (time.perf_counter() - t) / calls
        cpu, srv = (time.process_time() - c0) / calls, (server_cpu_seconds(server) - s0) / calls
        best = min(best, (wall, cpu, srv))
    return best


def redis_pid(redis_url: str) -> int | None:
    """The Redis server's process id, when it runs on this machine (for its CPU)."""
    from redis import Redis

    pid = Redis.from_url(redis_url).info("server").get("process_id")
    return pid if pid and pathlib.Path(f"/proc/{pid}").exists() else None


def idem_case(store: str):
    return idempotent(store=store, tool="ship", scope="bench-" + uuid.uuid4().hex[:8])(body)


def powertools_case(redis_url: str):
    os.environ.pop("POWERTOOLS_IDEMPOTENCY_DISABLED", None)
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer
    from redis import Redis

    # Outside Lambda it warns on each new key that no Lambda context was registered.
    warnings.filterwarnings("ignore", module="aws_lambda_powertools")
    layer = CachePersistenceLayer(client=Redis.from_url(redis_url))
    config = IdempotencyConfig(event_key_jmespath="id", expires_after_seconds=3600)
    return idempotent_function(
        data_keyword_argument="order",
        persistence_store=layer,
        config=config,
        key_prefix="idem-bench-" + uuid.uuid4().hex[:8],
    )(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--no-powertools", action="store_true")
    opts = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="idem-bench-")
    prefix = "idem-bench-" + uuid.uuid4().hex[:8]
    cases = [
        ("idem memory:", idem_case("memory:")),
        ("idem sqlite:", idem_case(f"sqlite:{tmp}/idem.db")),
        ("idem redis://", idem_case(f"{opts.redis}?prefix={prefix}&durability=volatile")),
    ]
    if not opts.no_powertools:
        cases.append(("Powertools idempotent_function, Redis", powertools_case(opts.redis)))

    counter = itertools.count()
    new_arg = lambda: {"id": f"o-{next(counter)}"}  # noqa: E731
    same = {"id": "o-replayed"}
    same_arg = lambda: same  # noqa: E731

    server = redis_pid(opts.redis)
    with scope("bench"):
        plain = best_mean(body, new_arg, opts.calls, opts.rounds)[0]
        rows = []
        for name, fn in cases:
            on_redis = server if "edis" in name else None
            fn(order=same)  # stored once; the replay rounds read it
            new = best_mean(fn, new_arg, max(opts.calls // 5, 200), opts.rounds, on_redis)
            replay = best_mean(fn, same_arg, opts.calls, opts.rounds, on_redis)
            rows.append((name, new, replay))

    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{opts.calls} calls x {opts.rounds} rounds (new keys: {max(opts.calls // 5, 200)}), best round")
    print(f"undecorated call: {plain * 1e6:.2f} us\n")
    print("CPU: this process's (all threads) + the Redis server's, us per call, in the best round\n")
    print("| decorator, store | new key: us/call | new keys/s | new key CPU | replay: us/call | replay CPU |")
    print("|---|---:|---:|---:|---:|---:|")
    us = lambda x: f"{x * 1e6:.1f}"  # noqa: E731
    cpu = lambda r: us(r[1]) + (f" + {us(r[2])}" if r[2] else "")  # noqa: E731
    for name, new, replay in rows:
        print(f"| {name} | {us(new[0])} | {1 / new[0]:,.0f} | {cpu(new)} | {us(replay[0])} | {cpu(replay)} |")


if __name__ == "__main__":
    main()
