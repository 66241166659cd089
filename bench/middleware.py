"""What idem's HTTP middleware costs a service, in CPU per request: the example payment service
(examples/services) on each framework, bare and with the middleware, new keys and replays, on
the memory and SQLite stores, under wrk. The CPU is user + system of the service's whole
process group (a gunicorn master and its worker included, from /proc/PID/stat) divided by the
requests wrk completed; requests/s is printed beside it for reference only (it moves with
the shared machine, the CPU per request much less).

    python bench/middleware.py [--seconds 5] [--connections 32] [fastapi express ...]

Needs wrk (apt-get install wrk), the Python package with the frameworks
(clients/python/tests/requirements.txt) in the running interpreter, `npm ci` in
examples/services/node, and release builds of the native modules (pip install ./clients/python;
node clients/js/scripts/build-native.mjs), as a user would have.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "conformance" / "http"))

import frontends  # noqa: E402

CONFIG = """anonymous = "allow"   # wrk sends no credentials
[[routes]]
method = "POST"
path = "/v1/charges"
require_key = true
"""
BODY = '{"customer":"cus_8g2k","amount_cents":4900}'
NEW = f"""
local n = 0
function setup(thread) n = n + 1; thread:set("tid", n) end
local counter = 0
local run = tostring(os.time()) .. "-" .. tostring(math.random(1000000))
request = function()
  counter = counter + 1
  return wrk.format("POST", "/v1/charges",
    {{["Idempotency-Key"] = run .. "-" .. tid .. "-" .. counter, ["Content-Type"] = "application/json"}},
    '{BODY}')
end
"""
SAME = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "bench-replay-{{run}}"
"""
BARE = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""


def group_ticks(pgid: int) -> int:
    """utime + stime of every process in the group, in clock ticks."""
    total = 0
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state ppid pgrp ... utime(12) stime(13), counting from state as 0.
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total


def wrk(url: str, script: pathlib.Path, seconds: int, connections: int) -> tuple:
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
                         capture_output=True, text=True, check=True).stdout
    requests = int(next(line.split()[0] for line in out.splitlines() if "requests in" in line))
    rps = float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")))
    p99 = next((line.split()[1] for line in out.splitlines() if line.strip().startswith("99%")), "?")
    errors = next((line.strip() for line in out.splitlines() if "Non-2xx" in line or "Socket errors" in line), "")
    return requests, rps, p99, errors


def measure(fe: frontends.Frontend, config: str, store: str, script: pathlib.Path, work: pathlib.Path, seconds: int, connections: int) -> tuple:
    ledger = work / f"{uuid.uuid4().hex}.jsonl"
    running = fe.start(pathlib.Path(config) if config != "off" else config, store, ledger, work / "service.log")
    try:
        url = f"{running.base}/v1/charges"
        # Warm: the replay's first request stores what the rest replay; JITs and caches settle.
        subprocess.run(["wrk", "-t2", "-c8", "-d2s", "-s", str(script), url], capture_output=True, check=False)
        tick = os.sysconf("SC_CLK_TCK")
        before = group_ticks(running.front.pid)
        requests, rps, p99, errors = wrk(url, script, seconds, connections)
        used = group_ticks(running.front.pid) - before
        return used / tick * 1e6 / max(requests, 1), rps, p99, errors
    finally:
        running.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("frontend", nargs="*", help="front ends (default: the middleware ones)")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=32)
    args = ap.parse_args()
    chosen = args.frontend or ["fastapi", "flask", "django", "express", "fastify", "hono"]
    fes = [f for f in frontends.frontends() if f.name in chosen and not f.gateway]
    with tempfile.TemporaryDirectory(prefix="idem-bench-mw-") as tmp:
        work = pathlib.Path(tmp)
        config = work / "idem.toml"
        config.write_text(CONFIG)
        scripts = {}
        for name, text in (("new", NEW), ("same", SAME.replace("{run}", uuid.uuid4().hex[:8])), ("bare", BARE)):
            scripts[name] = work / f"{name}.lua"
            scripts[name].write_text(text)
        print(f"wrk -t2 -c{args.connections} -d{args.seconds}s, {os.cpu_count()} cores, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
        print()
        print("| service | requests | store | CPU µs/request | × bare | requests/s | p99 |")
        print("|---|---|---|---:|---:|---:|---:|")
        for fe in fes:
            bare, rps, p99, errors = measure(fe, "off", "memory:", scripts["bare"], work, args.seconds, args.connections)
            print(f"| {fe.label} | bare handler | - | {bare:.0f} | 1.00 | {rps:.0f} | {p99} |{' ' + errors if errors else ''}", flush=True)
            for store_name, store in (("memory", "memory:"), ("SQLite", f"sqlite:{work / (fe.name + '.db')}")):
                for label, script in (("new keys", "new"), ("replays", "same")):
                    cpu, rps, p99, errors = measure(fe, str(config), store, scripts[script], work, args.seconds, args.connections)
                    print(f"| {fe.label} | {label} | {store_name} | {cpu:.0f} | {cpu / bare:.2f} | {rps:.0f} | {p99} |{' ' + errors if errors else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
