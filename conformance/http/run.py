"""Runs the HTTP conformance suite (cases.py) against front ends (frontends.py) and prints the
results table; exits non-zero if any case failed.

    python conformance/http/run.py                      # every front end
    python conformance/http/run.py fastapi express      # some
    python conformance/http/run.py --markdown out.md    # the table, for docs/
    python conformance/http/run.py --store redis express  # every case on Redis, not SQLite

Needs: target/debug/idem and target/debug/conformance-service (cargo build -p idem-cli -p
example-axum-charges), the Python package with uvicorn, gunicorn, FastAPI, Flask and Django
(conformance/http/requirements.txt) in the running interpreter, `npm ci` in
examples/services/node, and Redis on 127.0.0.1:6379 (the store-down case reaches it through a
relay it cuts).
"""

from __future__ import annotations

import argparse
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from typing import Dict, List, Optional, Tuple

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cases  # noqa: E402
import frontends  # noqa: E402


class Relay:
    """TCP to ``target``; ``cut(True)`` drops every connection and refuses new ones until
    ``cut(False)``."""

    def __init__(self, target: Tuple[str, int]) -> None:
        self.target = target
        self.cutoff = False
        self.conns: List[socket.socket] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.listener.accept()
            except OSError:
                return
            if self.cutoff:
                c.close()
                continue
            try:
                s = socket.create_connection(self.target)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, s]
            for a, b in ((c, s), (s, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self, off: bool) -> None:
        self.cutoff = off
        if off:
            with self.lock:
                for s in self.conns:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    s.close()
                self.conns.clear()


def variant_file(directory: pathlib.Path, variant: str) -> pathlib.Path:
    top, tables = cases.VARIANTS[variant]
    base = (HERE / "idem.toml").read_text()
    path = directory / f"idem-{variant}.toml"
    path.write_text(top + base + tables)
    return path


def inspector(store: str):
    def inspect(key: str, principal: str) -> str:
        out = subprocess.run([str(frontends.idem_binary()), "inspect", key, "--store", store, "--principal", principal],
                             capture_output=True, text=True, timeout=60)
        return out.stdout + out.stderr
    return inspect


def run_frontend(fe: frontends.Frontend, selected: List[cases.Case], work: pathlib.Path,
                 store_kind: str = "sqlite") -> Dict[str, Tuple[str, str]]:
    """Every selected case against one front end, on a ``store_kind`` store: case name ->
    (pass|fail, note)."""
    results: Dict[str, Tuple[str, str]] = {}
    by_variant: Dict[str, List[cases.Case]] = {}
    for c in selected:
        if c.only and fe.name not in c.only:
            results[c.name] = ("n/a", "")
            continue
        by_variant.setdefault(c.variant, []).append(c)
    for variant, group in by_variant.items():
        d = work / fe.name / variant
        d.mkdir(parents=True, exist_ok=True)
        config = variant_file(d, variant)
        relay = None
        if variant == "relay":
            relay = Relay(("127.0.0.1", 6379))
            store = f"redis://127.0.0.1:{relay.port}/?prefix=conf-{uuid.uuid4().hex[:8]}&durability=volatile"
        elif store_kind == "redis":
            store = f"redis://127.0.0.1:6379/?prefix=conf-{uuid.uuid4().hex[:8]}&durability=volatile"
        else:
            store = f"sqlite:{d / 'idem.db'}"
        ledger, log = d / "ledger.jsonl", d / "service.log"
        try:
            running = fe.start(config, store, ledger, log)
        except Exception as e:  # noqa: BLE001
            for c in group:
                results[c.name] = ("fail", f"did not start: {e}")
            continue
        state = {"running": running}

        def crash_and_restart() -> None:
            state["running"].kill()
            state["running"] = fe.restart(state["running"], config, store, ledger, log)
            svc.base = state["running"].base

        def count() -> int:
            try:
                return sum(1 for _ in open(ledger, encoding="utf-8"))
            except FileNotFoundError:
                return 0

        svc = cases.Service(
            base=running.base, name=fe.name, count=count, crash_and_restart=crash_and_restart,
            store=store, inspect=inspector(store), raises=fe.raises, cut=relay.cut if relay else None,
            prefix=fe.prefix,
        )
        try:
            for c in group:
                started = time.monotonic()
                try:
                    note = c.run(svc) or ""
                    results[c.name] = ("pass", note)
                except Exception as e:  # noqa: BLE001
                    detail = "".join(traceback.format_exception_only(type(e), e)).strip()
                    results[c.name] = ("fail", detail[:400])
                    print(f"  {fe.name} {c.name}: FAIL {detail[:400]}\n    (log: {log})", file=sys.stderr)
                print(f"  {fe.name} {c.name}: {results[c.name][0]} ({time.monotonic() - started:.1f}s)", file=sys.stderr)
        finally:
            state["running"].stop()
            if store.startswith("redis://"):
                forget_prefix(store)
    return results


def forget_prefix(store: str) -> None:
    """Deletes the relay variant's Redis records (under its fresh prefix) from the shared
    Redis."""
    prefix = store.split("prefix=", 1)[1].split("&", 1)[0]
    try:
        keys = subprocess.run(["redis-cli", "--scan", "--pattern", f"{prefix}:*"], capture_output=True, text=True, timeout=30).stdout.split()
        if keys:
            subprocess.run(["redis-cli", "del", *keys], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pass


def table(fes: List[frontends.Frontend], selected: List[cases.Case], results: Dict[str, Dict[str, Tuple[str, str]]]) -> str:
    head = "| case | " + " | ".join(f.name for f in fes) + " |"
    rule = "|---|" + "---|" * len(fes)
    rows = [head, rule]
    for c in selected:
        cells = []
        for f in fes:
            verdict, note = results.get(f.name, {}).get(c.name, ("-", ""))
            cells.append(f"{verdict}" + (f" ({note})" if note and verdict == "pass" else "") + (" ✗" if verdict == "fail" else ""))
        rows.append(f"| `{c.name}` | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append("Cases: " + "; ".join(f"`{c.name}`: {c.summary}" for c in selected) + ".")
    rows.append("")
    rows.append("Front ends: " + "; ".join(f"`{f.name}`: {f.label}" for f in fes) + ".")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("frontend", nargs="*", help="front ends to run (default: all)")
    ap.add_argument("--case", action="append", default=[], help="run only these cases")
    ap.add_argument("--markdown", type=pathlib.Path, help="write the results table here")
    ap.add_argument("--keep", type=pathlib.Path, help="keep stores, ledgers and logs in this directory")
    ap.add_argument("--store", choices=["sqlite", "redis"], default="sqlite",
                    help="the store of every case but the store-down one (which always cuts a relay to Redis); "
                         "a front end may call each kind of store its own way (the Node package: SQLite on libuv's "
                         "pool, Redis as tasks on idem's runtime)")
    args = ap.parse_args()
    fes = [f for f in frontends.frontends() if not args.frontend or f.name in args.frontend]
    unknown = set(args.frontend) - {f.name for f in fes}
    if unknown:
        print(f"unknown front ends: {sorted(unknown)}", file=sys.stderr)
        return 2
    selected = [c for c in cases.CASES if not args.case or c.name in args.case]
    results: Dict[str, Dict[str, Tuple[str, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="idem-http-conformance-") as tmp:
        work = args.keep or pathlib.Path(tmp)
        for fe in fes:
            print(f"{fe.label}:", file=sys.stderr)
            results[fe.name] = run_frontend(fe, selected, work / args.store, args.store)
    text = table(fes, selected, results)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    failed = [(f, c) for f, rs in results.items() for c, (v, _) in rs.items() if v not in ("pass", "n/a")]
    if failed:
        print(f"\n{len(failed)} failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
