"""Fork and the stores (crates/idem-embed/src/host.rs). A forked child of a process that had a
SQLite store open is refused SQLite: SQLite's locks do not survive fork(), and such a child
once hung in its first SQLite call on a mutex the parent's writer held. It gets an error that
says what to do; a child forked before any SQLite store was opened, and every child on a
server store (test_stores.py), works."""

from __future__ import annotations

import os
import signal
import tempfile
import time
import unittest
import uuid

from cli_support import need

from idem_runtime import ConfigurationError, idempotent, scope


def in_child(fn) -> int:
    """Runs ``fn`` in a forked child; its exit code (0: it returned True)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if fn() else 3
        except BaseException as e:
            code = 2 if isinstance(e, ConfigurationError) and "forkserver" in str(e) else 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _redis_missing():
    from idem_runtime import StoreUnavailableError, open_store

    try:
        open_store(REDIS)
        return None
    except StoreUnavailableError as e:
        return f"Redis at {REDIS} is not reachable: {e}"


REDIS = f"redis://127.0.0.1:6379/?prefix=fork-{uuid.uuid4().hex[:8]}&durability=volatile"


@unittest.skipUnless(hasattr(os, "fork"), "no fork here")
class Fork(unittest.TestCase):
    @need(_redis_missing())
    def test_a_child_forked_inside_a_call_returns_without_finishing_the_parents_claim(self):
        """A tool that forks: the child returns through the decorator too, with the parent's
        claim in hand. It must not finish it over the parent's runtime or connection (the
        child has neither: it hung there before), and it does not hang: it returns, the
        result unkept, and the parent's own return stores the result."""

        @idempotent(store=REDIS, tool="forks")
        def forks(n: int):
            pid = os.fork()
            if pid == 0:
                signal.alarm(20)  # a hang ends the child, and the test sees it
                return ["child", n]
            return ["parent", pid]

        parent = os.getpid()
        with scope("fork-in-call"):
            who = None
            try:
                who = forks(1)
            finally:
                if os.getpid() != parent:  # the child, whatever the call did, ends here
                    os._exit(0 if who is not None and who[0] == "child" else 1)
            child = who[1]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                done, status = os.waitpid(child, os.WNOHANG)
                if done:
                    break
                time.sleep(0.05)
            else:
                os.kill(child, signal.SIGKILL)
                self.fail("the child hung finishing its parent's claim")
            self.assertEqual(os.waitstatus_to_exitcode(status), 0)
            self.assertEqual(forks(1), ["parent", child], "the parent's result is the one kept")

    def test_a_child_of_a_process_with_sqlite_open_is_refused_sqlite_and_runs_nothing(self):
        with tempfile.TemporaryDirectory() as tmp:
            ran = os.path.join(tmp, "ran")

            @idempotent(store=f"sqlite:{tmp}/idem.db", tool="effect")
            def effect(n: int) -> int:
                open(ran, "a").write(f"{os.getpid()}\n")
                return n

            with scope("parent"):
                self.assertEqual(effect(1), 1)

            def child():
                with scope("child"):
                    return effect(2) == 2

            self.assertEqual(in_child(child), 2, "the child must get the ConfigurationError")
            # Another file is refused too: the inherited lock records are per process.
            other = idempotent(store=f"sqlite:{tmp}/other.db", tool="other")(lambda: True)
            self.assertEqual(in_child(lambda: other(idempotency_key="k-other")), 2)
            self.assertEqual(open(ran).read().count("\n"), 1, "nothing ran in the children")
            with scope("parent"):
                self.assertEqual(effect(1), 1)  # the parent's store still works

    def test_memory_stores_work_in_a_child(self):
        @idempotent(store="memory:", tool="mem")
        def mem(n: int) -> int:
            return n

        with scope("parent"):
            mem(1)

        def child():
            with scope("child"):
                return mem(5) == 5 and mem(5) == 5

        self.assertEqual(in_child(child), 0)


if __name__ == "__main__":
    unittest.main()
