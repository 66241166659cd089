"""The front ends the HTTP conformance suite runs against: every way idem answers HTTP, each
in front of (or inside) the same example payment service (examples/services, and the axum
one in examples/axum-charges), configured from the same TOML file.

A front end is started on a free port with a configuration file and a store URL, and can be
SIGKILLed and started again on the same store (the crash case).
"""

from __future__ import annotations

import http.client
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON_SERVICES = REPO / "examples" / "services" / "python"
NODE_SERVICES = REPO / "examples" / "services" / "node"


def target_dir() -> pathlib.Path:
    t = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return t if t.is_absolute() else REPO / t


def idem_binary() -> pathlib.Path:
    return pathlib.Path(os.environ.get("IDEM_BIN", target_dir() / "debug" / "idem"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(port: int, proc: subprocess.Popen, what: str, seconds: float = 60) -> None:
    _ready(port, proc, what, "", seconds)


def _ready(port: int, proc: subprocess.Popen, what: str, prefix: str, seconds: float = 60) -> None:
    """:func:`wait_for`, killing ``proc`` (its whole group) if it does not come up, so a
    failed start leaves nothing running."""
    try:
        wait_for(port, proc, what, seconds, prefix)
    except BaseException:
        _kill(proc)
        raise


def wait_for(port: int, proc: subprocess.Popen, what: str, seconds: float = 60, prefix: str = "") -> None:
    """Until the service answers ``GET /v1/charges`` (below ``prefix``): a listening socket
    is not enough (a gunicorn master listens before its worker has imported the app)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before answering")
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            c.request("GET", prefix + "/v1/charges")
            if c.getresponse().status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            c.close()
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer on {port} within {seconds}s")


@dataclass
class Running:
    """One started front end: its URL and its processes (the service's own, or the
    gateway's with the service behind it)."""

    base: str
    front: Optional[subprocess.Popen]
    behind: Optional[subprocess.Popen] = None
    behind_port: Optional[int] = None

    def kill(self) -> None:
        """SIGKILL the front end (its whole process group: a gunicorn master and its workers).
        Behind the gateway, only the gateway: the service it fronts goes on."""
        if self.front is not None:
            _kill(self.front)

    def stop(self) -> None:
        for p in (self.front, self.behind):
            if p is not None:
                _kill(p)


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


@dataclass
class Frontend:
    """How to start one front end: ``argv`` run in ``cwd`` with PORT set; ``gateway``:
    ``idem serve`` in front of the bare service that ``argv`` starts."""

    name: str
    label: str
    argv: List[str]
    cwd: pathlib.Path
    gateway: bool = False
    env: Dict[str, str] = field(default_factory=dict)
    #: What this front end's framework does with a handler's exception (the suite reports it).
    raises: str = ""
    #: The path the service is mounted under ($MOUNT): every request goes below it.
    prefix: str = ""

    def start(self, config: pathlib.Path, store: str, ledger: pathlib.Path, log: pathlib.Path) -> Running:
        env = {**os.environ, **self.env, "LEDGER": str(ledger), "IDEM_STORE": store, "PYTHONUNBUFFERED": "1"}
        out = open(log, "ab")
        port = free_port()
        ready = lambda p, proc, what: _ready(p, proc, what, self.prefix)  # noqa: E731
        try:
            if not self.gateway:
                proc = self._spawn(self.argv, {**env, "PORT": str(port), "IDEM_CONFIG": str(config)}, out, port)
                ready(port, proc, self.label)
                return Running(f"http://127.0.0.1:{port}", proc)
            up = free_port()
            behind = self._spawn(self.argv, {**env, "PORT": str(up), "IDEM_CONFIG": "off"}, out, up)
            ready(up, behind, f"{self.label}'s upstream")
            running = Running(f"http://127.0.0.1:{port}", None, behind, up)
            running.front = self.start_gateway(config, store, port, up, env, out)
            return running
        finally:
            out.close()  # the children hold their own descriptors

    def start_gateway(self, config, store, port, up, env, out) -> subprocess.Popen:
        argv = [str(idem_binary()), "serve", "--config", str(config), "--store", store,
                "--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{up}",
                "--admin-listen", f"127.0.0.1:{free_port()}"]
        proc = subprocess.Popen(argv, cwd=self.cwd, env={**env, "IDEM_LOG": "warn"}, stdout=out, stderr=out, start_new_session=True)
        ready(port, proc, "idem serve")
        return proc

    def restart(self, running: Running, config, store, ledger, log) -> Running:
        """After a crash: the front end again, on the same store (behind the gateway, the
        same service)."""
        port = int(running.base.rsplit(":", 1)[1])
        env = {**os.environ, **self.env, "LEDGER": str(ledger), "IDEM_STORE": store, "PYTHONUNBUFFERED": "1"}
        ready = lambda p, proc, what: _ready(p, proc, what, self.prefix)  # noqa: E731
        with open(log, "ab") as out:
            if self.gateway:
                running.front = self.start_gateway(config, store, port, running.behind_port, env, out)
                return running
            proc = self._spawn(self.argv, {**env, "PORT": str(port), "IDEM_CONFIG": str(config)}, out, port)
            ready(port, proc, self.label)
            return Running(running.base, proc, running.behind, running.behind_port)

    def _spawn(self, argv, env, out, port) -> subprocess.Popen:
        argv = [a.replace("{port}", str(port)) for a in argv]
        return subprocess.Popen(argv, cwd=self.cwd, env=env, stdout=out, stderr=out, start_new_session=True)


def python_bin(tool: str) -> str:
    return str(pathlib.Path(sys.executable).with_name(tool))


def frontends() -> List[Frontend]:
    uvicorn = [python_bin("uvicorn"), "--host", "127.0.0.1", "--port", "{port}", "--no-access-log"]
    # --preload: the app (and the middleware, with its store) is made before the worker forks,
    # as many deployments run it; a SQLite store must then be opened in the worker.
    gunicorn = [python_bin("gunicorn"), "-b", "127.0.0.1:{port}", "--workers", "1", "--threads", "16", "--preload", "--access-logfile", "/dev/null"]
    node = ["node"]
    return [
        # In front of the Express service: uvicorn closes a connection after an exception that
        # left the app once the response had started, which a pooled upstream connection then
        # meets as a reset (a request the gateway must then count as an unknown outcome).
        Frontend("idem-serve", "idem serve (gateway)", node + ["express_app.mjs"], NODE_SERVICES, gateway=True,
                 raises="the upstream's 500 page is its response, kept"),
        Frontend("tower", "tower layer (axum)", [str(target_dir() / "debug" / "conformance-service")], REPO,
                 raises="axum makes the handler's error a 500 response, kept"),
        Frontend("fastapi", "FastAPI (ASGI, uvicorn)", uvicorn + ["fastapi_app:app"], PYTHON_SERVICES,
                 raises="the exception leaves the app through the middleware: outcome unknown"),
        Frontend("litestar", "Litestar (ASGI, uvicorn)", uvicorn + ["litestar_app:app"], PYTHON_SERVICES,
                 raises="Litestar makes the exception its 500 response, kept"),
        Frontend("flask", "Flask (WSGI, gunicorn)", gunicorn + ["flask_app:app"], PYTHON_SERVICES,
                 raises="Flask makes the exception its 500 page, kept"),
        Frontend("django", "Django (WSGI, gunicorn)", gunicorn + ["django_app:wsgi_application"], PYTHON_SERVICES,
                 raises="Django makes the exception its 500 page, kept"),
        Frontend("django-asgi", "Django (ASGI, uvicorn)", uvicorn + ["django_app:application"], PYTHON_SERVICES,
                 raises="Django makes the exception its 500 page, kept"),
        Frontend("express", "Express 5", node + ["express_app.mjs"], NODE_SERVICES,
                 raises="Express makes the error its 500 page, kept"),
        # Mounted: app.use("/api", service) with the middleware inside the service, as a Router
        # at /api would have it; the routes (/v1/charges) are matched below the mount.
        Frontend("express-mounted", "Express 5 under app.use(\"/api\")", node + ["express_app.mjs"], NODE_SERVICES,
                 env={"MOUNT": "/api"}, prefix="/api", raises="Express makes the error its 500 page, kept"),
        Frontend("express4", "Express 4", node + ["express_app.mjs"], NODE_SERVICES, env={"EXPRESS": "express4"},
                 raises="Express makes the error its 500 page, kept"),
        Frontend("fastify", "Fastify 5", node + ["fastify_app.mjs"], NODE_SERVICES,
                 raises="Fastify makes the error its 500 reply, kept"),
        Frontend("hono", "Hono 4 (@hono/node-server)", node + ["hono_app.mjs"], NODE_SERVICES,
                 raises="Hono makes the error its 500 response, kept"),
    ]
