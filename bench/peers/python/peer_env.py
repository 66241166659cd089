"""What the peer services share: the example service's ledger (examples/services/python, so
every peer charges exactly as idem's own examples do) and the store the suite hands out.

The suite starts a front end with $IDEM_STORE: ``sqlite:PATH`` for most cases, a
``redis://HOST:PORT/?...`` URL (a relay to Redis it can cut) for the store-down case. Peers
have no use for idem's URL syntax, so this turns it into what each peer's store takes.
"""

from __future__ import annotations

import os
import pathlib
import sys
from urllib.parse import urlsplit

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "examples" / "services" / "python"))

import ledger  # noqa: E402,F401  (re-exported for the apps)


def redis_url() -> str:
    """Redis for the peers that store there: the suite's relay when it hands one out, else
    the machine's Redis."""
    store = os.environ.get("IDEM_STORE", "")
    if store.startswith("redis://"):
        u = urlsplit(store)
        return f"redis://{u.hostname}:{u.port or 6379}/0"
    return "redis://127.0.0.1:6379/0"


def prefix() -> str:
    """A namespace for this run's records in the shared Redis (bench/compare_peers.py sets a
    fresh one per run, and deletes it afterwards): the suite's fixed keys ("two words") must not
    meet a previous run's records."""
    return os.environ.get("PEER_PREFIX", "idem-peers")


def sqlite_path() -> str:
    """A SQLite file for the peers that store in a database: the suite's, when it hands one out."""
    store = os.environ.get("IDEM_STORE", "")
    if store.startswith("sqlite:"):
        return store[len("sqlite:"):]
    return str(pathlib.Path(os.environ.get("LEDGER", "ledger.jsonl")).with_name("peer.db"))
