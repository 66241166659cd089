"""Network pieces the HTTP and MCP tests share: a TCP proxy that loses answers, and `idem mcp`
over streamable HTTP in front of clients/python/upstream_server.py."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

from cli_support import HERE, REQUIRED, idem_binary


class FlakyProxy:
    """TCP in front of ``port``. While ``drops`` > 0, the next answer the gateway starts
    sending back is not relayed: the client's connection is reset instead. The request
    reached the gateway, the effect happened, the caller never hears of it. With ``only``
    set, only an answer to a request containing those bytes is dropped."""

    def __init__(self, port: int, only: bytes = b"") -> None:
        self.target = port
        self.only = only
        self.drops = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        server = socket.create_connection(("127.0.0.1", self.target))
        asked = bytearray()  # what the client sent since the last answer began
        threading.Thread(target=self._pump, args=(client, server, asked), daemon=True).start()
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                with self.lock:
                    drop = self.drops > 0 and self.only in asked
                    self.drops -= drop
                    self.dropped += drop
                    asked.clear()
                if drop:
                    break
                client.sendall(data)
        except OSError:
            pass
        finally:
            # shutdown() first: it wakes the pump blocked in recv(), so the close takes effect.
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _pump(self, src: socket.socket, dst: socket.socket, asked: bytearray) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self.lock:
                    asked.extend(data)
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()



def require(test, why) -> None:
    """Call first in ``setUp``: skips ``test`` for ``why`` (a missing package or binary), or
    fails it under IDEM_REQUIRE_SERVICES=1 (CI). (A class decorator would hide the class's
    tests instead of failing them.)"""
    if why:
        if REQUIRED:
            test.fail(f"IDEM_REQUIRE_SERVICES=1 but {why}")
        test.skipTest(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mcp_over_http(test, state: pathlib.Path, store: str, policy: pathlib.Path) -> int:
    """Starts upstream_server.py over HTTP and `idem mcp --listen` in front of it, stopped
    when ``test`` ends; returns the proxy's port (its endpoint is /mcp)."""
    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(HERE.parent / "upstream_server.py"), "http", str(port)],
        env={**os.environ, "UPSTREAM_STATE": str(state)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    test.addCleanup(lambda: (upstream.kill(), upstream.wait()))
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"upstream_server.py did not listen on {port}") from None
            time.sleep(0.1)
    proxy = subprocess.Popen(
        [str(idem_binary()), "mcp", "--listen", "127.0.0.1:0", "--upstream-url", f"http://127.0.0.1:{port}/mcp",
         "--store", store, "--policy", str(policy)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    test.addCleanup(lambda: (proxy.kill(), proxy.wait(), proxy.stdout.close()))
    url = next(w for w in proxy.stdout.readline().split() if w.startswith("http://"))
    return int(url.rstrip(";").rsplit(":", 1)[1].split("/", 1)[0])
