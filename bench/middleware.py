"""What idem's HTTP middleware costs a service, in CPU per request: the example payment service
(examples/services) on each framework, bare and with the middleware, new keys and replays, on
the memory and SQLite stores, under wrk. The CPU is user + system of the service's whole
process group (a gunicorn master and its worker included, from /proc/PID/stat) divided by the
requests wrk completed; requests/s is printed beside it for reference only (it moves with
the shared machine, the CPU per request much less). Each row is measured in --rounds rounds,
interleaved with the other rows of its service (bare, then the middleware's rows, then bare
again, ...), and the median is printed with the spread, so that a drift of the machine during
the run moves every row alike instead of one.

    python bench/middleware.py [--seconds 5] [--rounds 3] [--connections 32] [--paced MS] [fastapi express ...]
    python bench/middleware.py --peers [asgi-idempotency-header ...]

--paced MS holds every row to the same offered load: each connection waits MS milliseconds
after each answer (wrk's `delay()`), so a row runs at about connections / (MS + latency)
requests a second whatever its cost. Unpaced, wrk saturates the service, and a service that
answers slower leaves wrk's threads idle: each response then has to wake one, and that
wake-up is charged to the service's send (on this VM, 20 - 30 µs more per request than a
fast row pays). Paced, every row pays it alike, so the rows compare the service's own work.

--peers measures instead each peer library of bench/compare_peers.py (its own example service,
on its recommended store, from the peers' venv: --venv) beside idem's middleware on the same
framework and the same store, new keys and replays, interleaved the same way.

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

sys.path.insert(0, str(REPO / "bench"))

#: Each peer (bench/compare_peers.py) and idem's front end on its framework, on the peer's
#: store: memory, sqlite or redis. NestJS runs on Express: idem's Express service is its pair.
PEER_PAIRS = {
    "asgi-idempotency-header": ("fastapi", "redis"),
    "fastapi-idempotency": ("fastapi", "sqlite"),
    "django-idempotency-key": ("django", "redis"),
    "flask-idempotent": ("flask", "redis"),
    "express-idempotency": ("express", "memory"),
    "node-idempotency-nestjs": ("express", "redis"),
}

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
    """One row once: a fresh service process, warmed, then wrk: (CPU µs/request, requests/s, p99, errors)."""
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


def median(xs: list) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def setup(work: pathlib.Path, paced_ms: int = 0) -> tuple:
    """The middleware's configuration file and wrk's scripts, written under ``work``; with
    ``paced_ms``, each connection waits that long after each answer (see --paced)."""
    config = work / "idem.toml"
    config.write_text(CONFIG)
    scripts = {}
    pace = f"\nfunction delay() return {paced_ms} end\n" if paced_ms else ""
    for name, text in (("new", NEW), ("same", SAME.replace("{run}", uuid.uuid4().hex[:8])), ("bare", BARE)):
        scripts[name] = work / f"{name}.lua"
        scripts[name].write_text(text + pace)
    return config, scripts


def measured(rows: list, rounds: int, measure_row) -> list:
    """Every row ``rounds`` times, interleaved; per row (label, store, median CPU, min, max,
    median requests/s, last p99, last errors)."""
    got: dict = {i: [] for i in range(len(rows))}
    for _ in range(rounds):
        for i, row in enumerate(rows):
            got[i].append(measure_row(row))
    out = []
    for i, row in enumerate(rows):
        cpus = [g[0] for g in got[i]]
        out.append((row, median(cpus), min(cpus), max(cpus), median([g[1] for g in got[i]]), got[i][-1][2], got[i][-1][3]))
    return out


def peers_main(args, work: pathlib.Path, config: pathlib.Path, scripts: dict) -> int:
    import compare_peers

    all_peers = {p.frontend.name: p for p in compare_peers.peers(args.venv)}
    chosen = args.frontend or list(PEER_PAIRS)
    unknown = [n for n in chosen if n not in PEER_PAIRS or n not in all_peers]
    if unknown:
        print(f"unknown peers: {unknown}", file=sys.stderr)
        return 2
    prefix = f"idem-peers-{uuid.uuid4().hex[:8]}"
    ours = {f.name: f for f in frontends.frontends()}

    def store_of(kind: str, name: str) -> str:
        if kind == "redis":
            return f"redis://127.0.0.1:6379/?prefix={prefix}-{name}&durability=volatile"
        if kind == "sqlite":
            return f"sqlite:{work / (name + '-' + uuid.uuid4().hex[:6] + '.db')}"
        return "memory:"

    print("| peer | on | store | requests | peer CPU µs/request (median, min-max) | idem's CPU µs/request | idem ÷ peer | peer requests/s | idem's requests/s |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    try:
        for name in chosen:
            peer = all_peers[name]
            peer.frontend.env["PEER_PREFIX"] = prefix
            ours_name, kind = PEER_PAIRS[name]
            fe = ours[ours_name]
            rows = []
            for label, script in (("new keys", "new"), ("replays", "same")):
                rows += [("peer", label, peer.frontend, "off", script), ("idem", label, fe, str(config), script)]

            def one(row):
                who, _, front, cfg, script = row
                return measure(front, cfg, store_of(kind, front.name), scripts[script], work, args.seconds, args.connections)

            got = measured(rows, args.rounds, one)
            for j in range(0, len(got), 2):
                (p_row, p_cpu, p_lo, p_hi, p_rps, _, p_err), (_, i_cpu, i_lo, i_hi, i_rps, _, i_err) = got[j], got[j + 1]
                notes = "; ".join(f"{who}: {e}" for who, e in (("peer", p_err), ("idem", i_err)) if e)
                print(f"| {name} | {peer.frontend.label} | {kind} | {p_row[1]} | {p_cpu:.0f} ({p_lo:.0f}-{p_hi:.0f}) | "
                      f"{i_cpu:.0f} ({i_lo:.0f}-{i_hi:.0f}) | {i_cpu / p_cpu:.2f} | {p_rps:.0f} | {i_rps:.0f} |"
                      f"{' ' + notes if notes else ''}", flush=True)
    finally:
        compare_peers.forget(prefix, args.venv)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("frontend", nargs="*", help="front ends (default: the middleware ones), or peers with --peers")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paced", type=int, default=0, metavar="MS",
                    help="each connection waits MS ms after each answer: every row at the same offered load")
    ap.add_argument("--peers", action="store_true", help="measure the peer libraries beside idem on their stores")
    ap.add_argument("--venv", type=pathlib.Path, default=pathlib.Path(os.environ.get("PEERS_VENV", "/tmp/peers-venv")),
                    help="with --peers: the virtualenv holding bench/peers/python/requirements.txt")
    args = ap.parse_args()
    if args.peers:
        with tempfile.TemporaryDirectory(prefix="idem-bench-peers-") as tmp:
            work = pathlib.Path(tmp)
            config, scripts = setup(work, args.paced)
            print(f"wrk -t2 -c{args.connections} -d{args.seconds}s, {os.cpu_count()} cores, {args.rounds} rounds, "
                  f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
            print()
            return peers_main(args, work, config, scripts)
    chosen = args.frontend or ["fastapi", "litestar", "flask", "django", "express", "fastify", "hono"]
    fes = [f for f in frontends.frontends() if f.name in chosen and not f.gateway]
    with tempfile.TemporaryDirectory(prefix="idem-bench-mw-") as tmp:
        work = pathlib.Path(tmp)
        config, scripts = setup(work, args.paced)
        paced = f", paced: {args.paced} ms between a connection's requests" if args.paced else ", unpaced"
        print(f"wrk -t2 -c{args.connections} -d{args.seconds}s{paced}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
        print()
        print("| service | requests | store | CPU µs/request (median, min-max) | × bare | requests/s (median) | p99 (last) |")
        print("|---|---|---|---:|---:|---:|---:|")
        for fe in fes:
            rows = [("bare handler", "-", "off", "memory:", "bare")]
            for store_name, store in (("memory", "memory:"), ("SQLite", f"sqlite:{work / (fe.name + '.db')}")):
                rows += [("new keys", store_name, str(config), store, "new"), ("replays", store_name, str(config), store, "same")]
            got = measured(rows, args.rounds, lambda r: measure(fe, r[2], r[3], scripts[r[4]], work, args.seconds, args.connections))
            bare = got[0][1]
            for (label, store_name, *_), cpu, lo, hi, rps, p99, errors in got:
                print(f"| {fe.label} | {label} | {store_name} | {cpu:.0f} ({lo:.0f}-{hi:.0f}) | {cpu / bare:.2f} | {rps:.0f} | {p99} |{' ' + errors if errors else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
