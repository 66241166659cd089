"""The callers of test_stores.py, in a module of their own so that a 'spawn' child imports
only this (not the test module, which opens the stores to see whether they are reachable)."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid

import cli_support  # noqa: F401 (puts the package on the path)

from idem_runtime import idempotent, scope

_tools: dict = {}


def effect(effects: str, intent: str) -> dict:
    db = sqlite3.connect(effects, timeout=60)
    try:
        db.execute("INSERT INTO effects (intent, pid) VALUES (?, ?)", (intent, os.getpid()))
        db.commit()
    finally:
        db.close()
    time.sleep(0.2)  # long enough for the duplicates to arrive while it runs
    return {"intent": intent, "ran_in": os.getpid(), "token": uuid.uuid4().hex}


def tool(store: str):
    """One decorated tool per store URL per process (a forked child inherits the parent's,
    with its native store already open)."""
    t = _tools.get(store)
    if t is None:
        t = _tools[store] = idempotent(store=store, tool="effect", retention=600, wait=120)(effect)
    return t


def call(store: str, effects: str, intent: str, start=None) -> tuple:
    if start is not None:
        start.wait(60)
    with scope(intent):
        value, outcome = tool(store).call_with_outcome(effects, intent)
    return value, outcome.replayed, outcome.key


def _process_main(store, effects, intent, start, results):
    try:
        results.put(("ok", call(store, effects, intent, start)))
    except BaseException as e:  # reported to the parent, which fails the test
        results.put(("error", f"{type(e).__name__}: {e}"))


