"""The decorator on each store (SQLite, PostgreSQL, Redis): 16 threads and 16 processes
(multiprocessing, both 'spawn' and 'fork') calling one intent -> exactly one effect, and every
caller gets the same result. The effect is a row in a SQLite table of the test's own."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import unittest
import uuid

from cli_support import need
from store_workers import _process_main, call

from idem_runtime import StoreUnavailableError, open_store

PG = "postgres://postgres@127.0.0.1:5432/test?schema={}"
REDIS = "redis://127.0.0.1:6379/?prefix={}&durability=volatile"
N = 16

def reachable(url: str):
    try:
        open_store(url)
        return None
    except StoreUnavailableError as e:
        return f"store {url} is not reachable: {e}"


class Base:
    """The cases, run on each store by the subclasses below."""

    url: str

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.effects = os.path.join(self.tmp.name, "effects.db")
        db = sqlite3.connect(self.effects)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE effects (intent TEXT, pid INTEGER)")
        db.commit()
        db.close()

    def tearDown(self):
        self.tmp.cleanup()

    def rows(self, intent: str) -> int:
        db = sqlite3.connect(self.effects, timeout=60)
        try:
            return db.execute("SELECT COUNT(*) FROM effects WHERE intent = ?", (intent,)).fetchone()[0]
        finally:
            db.close()

    def check_once(self, intent: str, answers: list) -> None:
        self.assertEqual(len(answers), N)
        self.assertEqual(self.rows(intent), 1)
        values = [a[0] for a in answers]
        self.assertTrue(all(v == values[0] for v in values), values)
        self.assertEqual([a[1] for a in answers].count(False), 1, "exactly one caller ran it")
        self.assertEqual(len({a[2] for a in answers}), 1)

    def intent(self) -> str:
        return "i" + uuid.uuid4().hex[:12]

    def test_sequential_replay(self):
        intent = self.intent()
        first = call(self.url, self.effects, intent)
        second = call(self.url, self.effects, intent)
        self.assertEqual((first[0], first[1], second[1]), (second[0], False, True))
        self.assertEqual(self.rows(intent), 1)

    def test_threads(self):
        intent = self.intent()
        start, answers, errors = threading.Barrier(N), [], []

        def run():
            try:
                start.wait(60)
                answers.append(call(self.url, self.effects, intent))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run) for _ in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.check_once(intent, answers)

    def processes(self, method: str) -> None:
        ctx = multiprocessing.get_context(method)
        intent = self.intent()
        start, results = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=_process_main, args=(self.url, self.effects, intent, start, results))
            for _ in range(N)
        ]
        for p in procs:
            p.start()
        start.set()
        got = [results.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(60)
        self.assertEqual([g for g in got if g[0] != "ok"], [])
        answers = [g[1] for g in got]
        self.check_once(intent, answers)
        self.assertNotIn(os.getpid(), {a[0]["ran_in"] for a in answers})
        self.assertTrue(all(p.exitcode == 0 for p in procs))

    def test_processes_spawn(self):
        self.processes("spawn")

    @unittest.skipUnless("fork" in multiprocessing.get_all_start_methods(), "no fork here")
    def test_processes_fork_after_the_parent_used_the_store(self):
        # The parent opens the store and runs a call first: its runtime, its connections
        # and (for SQLite) its writer thread exist when it forks; each child must make its own.
        before = self.intent()
        self.assertFalse(call(self.url, self.effects, before)[1])
        self.processes("fork")
        # And the parent's own store still works after its children.
        self.assertTrue(call(self.url, self.effects, before)[1])
        self.assertEqual(self.rows(before), 1)


class SQLite(Base, unittest.TestCase):
    def setUp(self):
        super().setUp()
        self.url = f"sqlite:{self.tmp.name}/idem.db"

    @unittest.skipUnless("fork" in multiprocessing.get_all_start_methods(), "no fork here")
    def test_processes_fork_after_the_parent_used_the_store(self):
        # SQLite's locks do not survive fork(): each forked child is refused SQLite, with an
        # error that says what to do (test_fork.py has the rest), and nothing runs.
        before = self.intent()
        self.assertFalse(call(self.url, self.effects, before)[1])
        ctx = multiprocessing.get_context("fork")
        intent = self.intent()
        start, results = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=_process_main, args=(self.url, self.effects, intent, start, results))
            for _ in range(4)
        ]
        for p in procs:
            p.start()
        start.set()
        got = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        for status, detail in got:
            self.assertEqual(status, "error")
            self.assertIn("ConfigurationError", detail)
            self.assertIn("forkserver", detail)
        self.assertEqual(self.rows(intent), 0)
        # The parent's own store still works after its children.
        self.assertTrue(call(self.url, self.effects, before)[1])


_PG_SCHEMA = "idem_py_" + uuid.uuid4().hex[:10]
_PG_URL = PG.format(_PG_SCHEMA)


@need(reachable(_PG_URL))
class Postgres(Base, unittest.TestCase):
    url = _PG_URL

    @classmethod
    def tearDownClass(cls):
        if shutil.which("psql"):
            subprocess.run(
                ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc",
                 f"DROP SCHEMA IF EXISTS {_PG_SCHEMA} CASCADE"],
                capture_output=True, check=False,
            )


_REDIS_URL = REDIS.format("idem-py-" + uuid.uuid4().hex[:10])


@need(reachable(_REDIS_URL))
class Redis(Base, unittest.TestCase):
    url = _REDIS_URL


if __name__ == "__main__":
    unittest.main()
