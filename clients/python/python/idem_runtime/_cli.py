"""The ``idem`` command of the package: the gateway, the MCP proxy, ``inspect``, ``resolve``,
... (the Rust binary of crates/idem-cli), which the wheel carries in ``idem_runtime/_bin``.

This launcher replaces itself with the binary (``execv``): the binary gets the process, its
standard streams and every signal exactly as if it had been run directly, which a stdio MCP
proxy under an MCP client's ``"command": "uvx"`` line needs (SIGTERM and EOF reach it, and its
exit status is the command's).

``IDEM_BINARY`` names another binary to run instead (a build of one's own).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import NoReturn, Optional, Sequence

#: Where the wheel puts the binary, beside this file.
BUNDLED = Path(__file__).resolve().parent / "_bin" / ("idem.exe" if os.name == "nt" else "idem")

SOURCE_BUILD = "cargo install --locked --path crates/idem-cli (from a checkout of the idem repository)"


def binary() -> Path:
    """The binary this launcher runs: ``$IDEM_BINARY``, else the one the wheel carries."""
    given = os.environ.get("IDEM_BINARY")
    return Path(given) if given else BUNDLED


def fail(message: str) -> NoReturn:
    print(f"idem-runtime: {message}", file=sys.stderr)
    raise SystemExit(127)


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    path = binary()
    if not path.is_file():
        fail(
            f"the idem binary is not at {path}. The wheels carry it; an install built from "
            f"source (the sdist) does not. Install a wheel (pip install --force-reinstall "
            f"--only-binary idem-runtime idem-runtime), or build the binary, {SOURCE_BUILD}, "
            f"and set IDEM_BINARY to it."
        )
    try:
        if os.name == "nt":
            # Windows has no exec: os.execv starts a new process and this one exits at once,
            # losing the exit status and the console. Run it as a child instead.
            import subprocess

            raise SystemExit(subprocess.call([str(path), *args]))
        os.execv(path, [str(path), *args])
    except OSError as e:
        fail(
            f"{path} cannot be run ({e.strerror or e}): the file is damaged, or not built for "
            f"this machine ({platform.system()} {platform.machine()}). Reinstall the package "
            f"(pip install --force-reinstall idem-runtime), or build the binary, {SOURCE_BUILD}, "
            f"and set IDEM_BINARY to it."
        )
    raise AssertionError("execv returned")  # pragma: no cover


if __name__ == "__main__":
    main()
