"""The ``idem`` command of the package (idem_runtime/_cli.py): it becomes the binary the wheel
carries (execv), so the binary has the process, its streams, its signals and its exit status
as if it had been run directly; a missing or damaged binary is one message naming the path and
what to do. ``IDEM_BINARY`` stands in for the wheel's binary: a shell script that reports what
it got. Where a wheel is installed, the real binary is checked too."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import idem_runtime._cli as cli


def launch(env: dict, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "idem_runtime", *args], env={**os.environ, **env}, text=True, **kw
    )


class Launcher(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="idem-cli-"))
        self.addCleanup(shutil.rmtree, self.dir, True)

    def script(self, body: str) -> str:
        path = self.dir / "fake-idem"
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return str(path)

    def test_the_binary_takes_the_process_its_streams_and_its_exit_status(self) -> None:
        fake = self.script('echo "pid:$$ args:$*"; cat; exit 7')
        p = launch({"IDEM_BINARY": fake}, "mcp", "--store", "memory:", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        out, _ = p.communicate("from stdin\n", timeout=30)
        self.assertEqual(p.returncode, 7)
        self.assertEqual(out, f"pid:{p.pid} args:mcp --store memory:\nfrom stdin\n")

    def test_sigterm_reaches_the_binary(self) -> None:
        mark = self.dir / "got"
        fake = self.script(f"trap 'echo TERM > {mark}; exit 0' TERM\necho ready\nwhile :; do sleep 0.05; done")
        p = launch({"IDEM_BINARY": fake}, stdout=subprocess.PIPE)
        self.assertEqual(p.stdout.readline().strip(), "ready")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=30), 0)
        p.stdout.close()
        self.assertEqual(mark.read_text().strip(), "TERM")

    def test_a_missing_binary_is_named_with_the_path_looked_in(self) -> None:
        missing = self.dir / "no-such-idem"
        p = launch({"IDEM_BINARY": str(missing)}, "--version", stderr=subprocess.PIPE)
        _, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 127)
        self.assertIn(f"the idem binary is not at {missing}", err)
        self.assertIn("cargo install --locked --path crates/idem-cli", err)

    def test_a_damaged_binary_is_named_with_what_to_do(self) -> None:
        bad = self.dir / "idem"
        bad.write_text("<html>a proxy's error page, saved as the binary</html>\n")
        bad.chmod(0o755)
        p = launch({"IDEM_BINARY": str(bad)}, "--version", stderr=subprocess.PIPE)
        _, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 127)
        self.assertIn(f"{bad} cannot be run (Exec format error): the file is damaged, or not built for this machine", err)

    @unittest.skipUnless(cli.BUNDLED.is_file(), "an install from source: no binary in the package")
    def test_the_bundled_binary_reports_the_packages_version(self) -> None:
        from importlib.metadata import version

        env = {k: v for k, v in os.environ.items() if k != "IDEM_BINARY"}
        out = subprocess.run([sys.executable, "-m", "idem_runtime", "--version"], env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), f"idem {version('idem-runtime')}")
        # The console script pip wrote beside the interpreter is the same launcher.
        script = Path(sys.executable).parent / "idem"
        self.assertTrue(script.is_file(), script)
        again = subprocess.run([str(script), "--version"], env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(again.stdout, out.stdout, again.stderr)


if __name__ == "__main__":
    unittest.main()
