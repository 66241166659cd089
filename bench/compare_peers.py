"""Runs idem's HTTP conformance suite (conformance/http: its cases and its runner, imported,
not copied) against peer idempotency libraries from PyPI and npm, each in front of the same
example payment service (bench/peers), and writes the per-case table (docs/comparison.md
carries it). A comparison, not a test: it exits 0 whatever the peers answer, and non-zero only
when something could not run at all.

    # once: the peers, pinned
    python3 -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install -r bench/peers/python/requirements.txt
    (cd bench/peers/node && npm ci)
    # the run (idem's FastAPI front end too, when the interpreter has idem_runtime)
    /tmp/venv/bin/python bench/compare_peers.py --markdown /tmp/peers-table.md

A run takes about 3 minutes; --deadline (default 900 s) stops it, and the front end it is in,
if a peer hangs past the cases' own timeouts.

Needs Redis on 127.0.0.1:6379 (the peers that store in Redis; the store-down case's relay).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "conformance" / "http"))

import cases  # noqa: E402
import frontends  # noqa: E402
import run  # noqa: E402

PEERS_PY = REPO / "bench" / "peers" / "python"
PEERS_NODE = REPO / "bench" / "peers" / "node"


@dataclass
class Peer:
    frontend: frontends.Frontend
    #: (registry, package) whose installed version the table names.
    package: Tuple[str, str]
    framework: Tuple[str, str]
    store: str
    #: Cases that cannot mean anything for this front end: case name -> why.
    not_applicable: Dict[str, str] = field(default_factory=dict)
    version: str = "?"


NO_RELAY = "n/a: its store is {}; the suite's relay can cut only Redis"


def peers(venv: pathlib.Path) -> List[Peer]:
    uvicorn = [str(venv / "bin" / "uvicorn"), "--host", "127.0.0.1", "--port", "{port}", "--no-access-log"]
    # As conformance/http/frontends.py runs idem's Flask and Django services.
    gunicorn = [str(venv / "bin" / "gunicorn"), "-b", "127.0.0.1:{port}", "--workers", "1", "--threads", "16",
                "--access-logfile", "/dev/null"]
    return [
        Peer(frontends.Frontend("asgi-idempotency-header", "asgi-idempotency-header (FastAPI, uvicorn)",
                                uvicorn + ["asgi_idempotency_header_app:app"], PEERS_PY),
             ("pypi", "asgi-idempotency-header"), ("pypi", "fastapi"), "Redis (`RedisBackend`)"),
        Peer(frontends.Frontend("fastapi-idempotency", "fastapi-idempotency (FastAPI, uvicorn)",
                                uvicorn + ["fastapi_idempotency_app:app"], PEERS_PY),
             ("pypi", "fastapi-idempotency"), ("pypi", "fastapi"), "SQLite (`TortoiseStore`, tortoise-orm)",
             {"store-down": NO_RELAY.format("a SQLite file")}),
        Peer(frontends.Frontend("django-idempotency-key", "django-idempotency-key (Django WSGI, gunicorn)",
                                gunicorn + ["django_idempotency_key_app:application"], PEERS_PY),
             ("pypi", "django-idempotency-key"), ("pypi", "django"),
             "Redis (`CacheKeyStorage` on django-redis, `MultiProcessRedisLock`)"),
        Peer(frontends.Frontend("flask-idempotent", "Flask-Idempotent (Flask WSGI, gunicorn)",
                                gunicorn + ["flask_idempotent_app:app"], PEERS_PY),
             ("pypi", "flask-idempotent"), ("pypi", "flask"), "Redis (its only store)"),
        Peer(frontends.Frontend("express-idempotency", "express-idempotency (Express 5)",
                                ["node", "express_idempotency_app.mjs"], PEERS_NODE),
             ("npm", "express-idempotency"), ("npm", "express"), "in-memory (the default `InMemoryDataAdapter`)",
             {"store-down": NO_RELAY.format("in the process's memory")}),
        Peer(frontends.Frontend("node-idempotency-nestjs", "@node-idempotency/nestjs (NestJS 10, Express platform)",
                                ["node", "nestjs_app.mjs"], PEERS_NODE),
             ("npm", "@node-idempotency/nestjs"), ("npm", "@nestjs/core"), "Redis (`StorageAdapterEnum.redis`)"),
    ]


def forget(prefix: str, venv: pathlib.Path) -> None:
    """Deletes this run's records from the shared Redis (every peer that stores there names
    its keys with ``prefix``)."""
    code = ("import redis, sys\n"
            "r = redis.Redis.from_url('redis://127.0.0.1:6379/0')\n"
            "print(sum(r.delete(k) for k in r.scan_iter(match=f'*{sys.argv[1]}*', count=1000)))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code, prefix], capture_output=True, text=True, timeout=60)
    print(f"deleted {out.stdout.strip() or '?'} Redis keys of this run {out.stderr.strip()[-200:]}", file=sys.stderr)


def installed_version(registry: str, package: str, venv: pathlib.Path) -> str:
    if registry == "npm":
        try:
            return json.loads((PEERS_NODE / "node_modules" / package / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError):
            return "not installed"
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          f"import importlib.metadata as m; print(m.version({package!r}))"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() if out.returncode == 0 else "not installed"


# --- short notes from the suite's assertion messages ----------------------------------------

# cases.Reply.__repr__: "STATUS {headers} b'body'" (the body cut at 300 bytes).
REPLY = re.compile(r"(\d{3}) \{(.*?)\} b(['\"])((?:\\.|(?!\3).)*)\3")


def brief_reply(status: str, headers: str, body: str) -> str:
    head = status + (" replayed" if "'idempotent-replayed'" in headers else "")
    parts = []
    text = body.encode().decode("unicode_escape", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        if doc.get("object") == "charge":
            # The id tells a replay (the same charge) from a second execution.
            parts.append(f"charge {str(doc.get('id'))[:9]}")
        else:
            for k in ("detail", "message", "error", "title"):
                if k in doc:
                    m = str(doc[k])
                    parts.append(json.dumps(m if len(m) <= 60 else m[:60] + "…", ensure_ascii=False))
                    break
            else:
                parts.append(text[:50])
    elif text.lstrip().startswith("<"):
        parts.append("HTML page")
    elif text:
        parts.append(repr(text[:50]))
    else:
        parts.append("empty body")
    return f"{head}: {' '.join(parts)}"


def brief(detail: str) -> str:
    """The failure, in a table cell: the peer's answers condensed, the suite's words kept."""
    kind, _, msg = detail.partition(": ")
    if kind in ("TimeoutError", "socket.timeout") or "timed out" in kind:
        return "no answer within the client's timeout"
    if kind in ("ConnectionResetError", "RemoteDisconnected", "http.client.RemoteDisconnected", "ConnectionRefusedError"):
        return f"connection failed ({kind.rsplit('.', 1)[-1]})"
    if kind == "FileNotFoundError" and "idem" in msg:
        # Only the crash case runs a program (`idem inspect`), after its answer was checked.
        return "could not run `idem inspect`: target/debug/idem is not built"
    if kind != "AssertionError":
        return f"{kind}: {msg[:100]}"
    # request_spellings quotes the raw bytes of the answer.
    msg = re.sub(r"b['\"]HTTP/1\.[01] (\d{3}) ([^\\]*)\\r\\n.*", r"\1 \2", msg)
    replies = [brief_reply(m.group(1), m.group(2), m.group(4)) for m in REPLY.finditer(msg)]
    if msg.startswith("[") and len(replies) > 2:  # concurrent: many answers, counted
        return "answers: " + ", ".join(f"{n}× {r}" for r, n in Counter(replies).items())
    msg = REPLY.sub(lambda m: brief_reply(m.group(1), m.group(2), m.group(4)), msg)
    msg = re.sub(r"^expected (\d{3}) ([\w-]+), got ", r"wanted \1 \2, got ", msg)
    msg = re.sub(r"^not a problem document: (.*)", r"status right, but \1, not problem+json", msg)
    msg = re.sub(r"^(\d+) charges where (\d+) were expected", r"\1 charges (\2 expected)", msg)
    msg = msg.replace("\n", " ")
    return msg[:160] + ("…" if len(msg) > 160 else "")


class Deadline(BaseException):
    """Raised by SIGALRM: not an Exception, so it passes run.run_frontend's per-case handler
    and reaches its ``finally``, which stops the front end."""


class Failed(Exception):
    """A case's failure, restated for the table (run.run_frontend records ``str`` of it)."""


def observed(case: cases.Case, raw: Dict[Tuple[str, str], str]) -> cases.Case:
    """The case as it is, plus the charges it saw and a short note when it fails; the
    suite's own message is kept in ``raw``."""

    def run_case(svc: cases.Service) -> Optional[str]:
        start = svc.count()
        try:
            return case.run(svc)
        except Exception as e:  # noqa: BLE001
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            raw[(svc.name, case.name)] = detail
            n = svc.count() - start
            raise Failed(f"{brief(detail)} · {n} charge{'' if n == 1 else 's'} in the case") from None

    return cases.Case(case.name, run_case, case.summary, case.variant)


def cell(verdict: str, note: str) -> str:
    note = note.removeprefix("Failed: ").replace("|", "\\|")
    if verdict == "pass":
        return "pass" + (f" ({note})" if note else "")
    if verdict == "n/a":
        return note
    if verdict == "-":
        return "not run"
    return f"**fail**: {note}"


def render(fes: List[Tuple[str, str]], selected: List[cases.Case], results: Dict[str, Dict[str, Tuple[str, str]]]) -> str:
    """One row per case, one column per front end (run.table's layout, with the notes)."""
    rows = ["| case | " + " | ".join(f"`{n}`" for n, _ in fes) + " |", "|---|" + "---|" * len(fes)]
    for c in selected:
        cells = [cell(*results.get(n, {}).get(c.name, ("-", "not run"))) for n, _ in fes]
        rows.append(f"| `{c.name}` | " + " | ".join(cells) + " |")
    totals = []
    for n, _ in fes:
        vs = [v for v, _ in results.get(n, {}).values()]
        totals.append(f"{vs.count('pass')}/{len(vs) - vs.count('n/a')}")
    rows.append("| **passed** | " + " | ".join(totals) + " |")
    return "\n".join(rows)


def run_all(todo, idem_fes, wrapped, selected, work, results, columns, could_not_run) -> None:
    """Every case against every front end in ``todo`` (front end, cases not applicable)."""
    for fe, skip in todo:
        # idem's own front ends are named after their framework: say whose they are.
        column = f"idem-{fe.name}" if fe in idem_fes else fe.name
        columns.append((column, fe.label))
        started = time.monotonic()
        print(f"{fe.label}:", file=sys.stderr)
        got = run.run_frontend(fe, [c for c in wrapped if c.name not in skip], work)
        got.update({c: ("n/a", why) for c, why in skip.items() if any(s.name == c for s in selected)})
        results[column] = got
        if all(v == "fail" and note.startswith("did not start") for v, note in got.values() if v != "n/a"):
            could_not_run.append(fe.name)
        print(f"  ({time.monotonic() - started:.0f}s)", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("peer", nargs="*", help="peers to run (default: all)")
    ap.add_argument("--venv", type=pathlib.Path, default=pathlib.Path(os.environ.get("PEERS_VENV", "/tmp/peers-venv")),
                    help="the virtualenv holding bench/peers/python/requirements.txt")
    ap.add_argument("--idem", action="append", default=None,
                    help="idem front ends (conformance/http/frontends.py) to run alongside; default: fastapi "
                         "when this interpreter has idem_runtime; --idem none for none")
    ap.add_argument("--case", action="append", default=[], help="run only these cases")
    ap.add_argument("--markdown", type=pathlib.Path, help="write the table (and the versions) here")
    ap.add_argument("--keep", type=pathlib.Path, help="keep ledgers, stores and service logs in this directory")
    ap.add_argument("--deadline", type=int, default=900, help="seconds for the whole run (default 900)")
    args = ap.parse_args()

    all_peers = peers(args.venv)
    chosen = [p for p in all_peers if not args.peer or p.frontend.name in args.peer]
    unknown = set(args.peer) - {p.frontend.name for p in all_peers}
    if args.idem is None:
        args.idem = ["fastapi"] if importlib.util.find_spec("idem_runtime") else []
    idem_names = [n for n in args.idem if n != "none"]
    idem_fes = [f for f in frontends.frontends() if f.name in idem_names]
    unknown |= set(idem_names) - {f.name for f in idem_fes}
    if unknown:
        print(f"unknown front ends: {sorted(unknown)}", file=sys.stderr)
        return 2
    # A namespace of this run's own in the shared Redis: the suite's few fixed keys ("two
    # words") must not meet a previous run's records.
    prefix = f"idem-peers-{uuid.uuid4().hex[:8]}"
    for p in chosen:
        p.frontend.env["PEER_PREFIX"] = prefix
        p.version = installed_version(*p.package, args.venv)
        p.framework = (p.framework[1], installed_version(*p.framework, args.venv))

    selected = [c for c in cases.CASES if not args.case or c.name in args.case]
    raw: Dict[Tuple[str, str], str] = {}
    wrapped = [observed(c, raw) for c in selected]
    results: Dict[str, Dict[str, Tuple[str, str]]] = {}
    columns: List[Tuple[str, str]] = []
    could_not_run: List[str] = []
    def on_alarm(signum, frame):
        raise Deadline()

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.deadline)
    with tempfile.TemporaryDirectory(prefix="idem-peers-") as tmp:
        work = args.keep or pathlib.Path(tmp)
        todo = [(f, {}) for f in idem_fes] + [(p.frontend, p.not_applicable) for p in chosen]
        try:
            run_all(todo, idem_fes, wrapped, selected, work, results, columns, could_not_run)
        except Deadline:
            print(f"stopped at the {args.deadline} s deadline", file=sys.stderr)
            could_not_run.append(f"deadline ({args.deadline} s)")
        signal.alarm(0)

    if chosen:
        forget(prefix, args.venv)
    text = render(columns, selected, results)
    print(text)
    for (fe, case), detail in sorted(raw.items()):
        print(f"\n[{fe} {case}] {detail}", file=sys.stderr)
    if args.markdown:
        lines = [text, "", "Front ends: " + "; ".join(f"`{n}`: {label}" for n, label in columns) + ".", ""]
        lines.append("Versions: " + "; ".join(
            f"`{p.frontend.name}` {p.version} on {p.framework[0]} {p.framework[1]}, store: {p.store}" for p in chosen) + ".")
        args.markdown.write_text("\n".join(lines) + "\n")
    if could_not_run:
        print(f"could not run at all: {could_not_run}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
