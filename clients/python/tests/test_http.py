"""idem_runtime.http through the real gateway (`idem serve`, the binary) in front of a local
upstream that counts executions; a flaky TCP proxy between the client and the gateway loses
answers (it lets the request through, waits for the gateway's answer, then resets the
client's connection), as a network does after the effect landed.

Run: cd clients/python && IDEM_BIN=target/debug/idem python -m unittest tests.test_http -v
Without httpx or the binary the tests skip, unless IDEM_REQUIRE_SERVICES=1 (CI): then they fail.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cli_support import cli_missing, idem, idem_binary
from net_support import FlakyProxy, require

try:
    import httpx
except ImportError:  # pragma: no cover - reported by need()
    httpx = None

WHY = None if httpx is not None else "httpx is not installed (pip install httpx)"
WHY = WHY or cli_missing()
PRINCIPAL = {"Authorization": "Bearer agent-1"}


class Upstream:
    """A payment API that is not idempotent: every POST to /v1/charges is an execution.
    ``script[path]`` lists answers (status, headers) given before the normal one."""

    def __init__(self) -> None:
        self.executions: list = []
        self.script: dict = {}
        self.lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with upstream.lock:
                    scripted = upstream.script.get(self.path) or []
                    status, headers = scripted.pop(0) if scripted else (201, {})
                    if status < 300:
                        upstream.executions.append((self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(body or b"{}")))
                    n = len(upstream.executions)
                out = json.dumps({"charge_id": f"ch_{n}", "status": status}).encode()
                self.send_response(status)
                for k, v in {"content-type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # the gateway closing a kept-alive connection is not news

        self.server = Quiet(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Gateway:
    """`idem serve` on a free port in front of ``upstream``, over a SQLite store."""

    def __init__(self, upstream_port: int, store: str) -> None:
        self.store = store
        self.proc = subprocess.Popen(
            [str(idem_binary()), "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
             "--upstream", f"http://127.0.0.1:{upstream_port}", "--store", store],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.close()
            raise RuntimeError(f"idem serve did not start: {line!r}")
        self.port = int(line.split("listening on ", 1)[1].split(";", 1)[0].rsplit(":", 1)[1])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def start(test) -> None:
    """The upstream, the gateway before it and the flaky proxy before that, for ``test``."""
    tmp = tempfile.TemporaryDirectory(prefix="idem-http-")
    test.addCleanup(tmp.cleanup)
    test.store = f"sqlite:{tmp.name}/idem.db"
    test.upstream = Upstream()
    test.addCleanup(test.upstream.close)
    test.gateway = Gateway(test.upstream.port, test.store)
    test.addCleanup(test.gateway.close)
    test.proxy = FlakyProxy(test.gateway.port)
    test.addCleanup(test.proxy.close)


class ThroughTheGateway(unittest.TestCase):
    def setUp(self):
        require(self, WHY)
        from idem_runtime.http import RetryPolicy

        start(self)
        self.url = f"http://127.0.0.1:{self.proxy.port}/v1/charges"
        self.attempts = []
        self.slept = []
        # Short waits keep the test quick; the decisions are the defaults'.
        self.retry = RetryPolicy(base=0.05, cap=0.5)

    def client(self, scope="run-7", sleep=None, **kw):
        from idem_runtime.http import IdempotentTransport

        def record(delay):
            self.slept.append(delay)
            (sleep or (lambda d: None))(delay)

        transport = IdempotentTransport(scope=scope, retry=self.retry, on_attempt=self.attempts.append,
                                        sleep=record, **kw)
        c = httpx.Client(transport=transport, headers=PRINCIPAL, timeout=30)
        self.addCleanup(c.close)
        return c

    def test_a_lost_answer_is_retried_with_the_same_key_and_replayed(self):
        import time

        from idem_runtime import derive_key
        from idem_runtime.http import call_info, intent, request_intent

        args = {"customer": "cus_1", "amount_cents": 4900}
        self.proxy.drops = 1
        # A real sleep: a retry that overtakes the first request's completion gets 409 in-flight
        # with Retry-After, and must wait it out.
        r = self.client(sleep=time.sleep).post(self.url, json=args, extensions=intent("charge_card"))
        # The intent is the method, the URL and the body (docs/key-derivation.md).
        key = derive_key("run-7", "charge_card", request_intent("POST", self.url, args))
        self.assertEqual(self.proxy.dropped, 1)
        self.assertEqual(r.status_code, 201, r.text)
        self.assertEqual(len(self.upstream.executions), 1, "one charge, however many attempts")
        info = call_info(r)
        self.assertEqual((info.key, info.replayed), (key, True))
        self.assertGreaterEqual(info.attempts, 2)
        self.assertTrue(all(a.key == key and a.tool == "charge_card" for a in self.attempts))
        self.assertIsInstance(self.attempts[0].error, httpx.TransportError)
        # The key went as the header, an sf-string; the body went as given (a service whose
        # model forbids extra fields takes it).
        _, headers, body = self.upstream.executions[0]
        self.assertEqual(headers["idempotency-key"], f'"{key}"')
        self.assertEqual(body, args)
        # The CLI reads the record the gateway kept.
        out = idem("inspect", key, "--store", self.store, "--principal", f"authorization: {PRINCIPAL['Authorization']}")
        self.assertIn("completed", out.stdout)

    def test_400_is_not_retried(self):
        from idem_runtime.http import intent

        self.upstream.script["/v1/charges"] = [(400, {})]
        r = self.client().post(self.url, json={"amount_cents": -1}, extensions=intent("charge_card"))
        self.assertEqual(r.status_code, 400)
        self.assertEqual([a.status for a in self.attempts], [400])
        self.assertEqual(self.slept, [])

    def test_retry_after_on_a_scripted_503_is_honoured(self):
        from idem_runtime.http import call_info, intent

        # The gateway releases the key on 503 (release_statuses): the retry executes.
        self.upstream.script["/v1/charges"] = [(503, {"Retry-After": "2"})]
        r = self.client().post(self.url, json={"customer": "cus_2", "amount_cents": 1}, extensions=intent("charge_card"))
        self.assertEqual(r.status_code, 201)
        self.assertEqual([a.status for a in self.attempts], [503, 201])
        self.assertEqual(len(self.slept), 1)
        self.assertGreaterEqual(self.slept[0], 2.0, "never sooner than Retry-After")
        self.assertEqual(call_info(r).attempts, 2)
        self.assertEqual(len(self.upstream.executions), 1)

    def test_an_unkeyed_post_is_not_retried_once_it_may_have_been_sent(self):
        from idem_runtime.http import HTTPOutcomeUnknownError

        self.proxy.drops = 1
        with self.assertRaises(HTTPOutcomeUnknownError) as caught:
            self.client().post(self.url, json={"customer": "cus_3", "amount_cents": 5})
        self.assertIsInstance(caught.exception, httpx.TransportError)
        self.assertIn("may have been executed", str(caught.exception))
        self.assertEqual(len(self.attempts), 1)
        self.assertEqual(self.slept, [])
        self.assertEqual(len(self.upstream.executions), 1, "it did execute: a blind retry would charge twice")

    def test_an_unkeyed_post_is_retried_when_surely_not_sent_and_on_429(self):
        # Refused connections: nothing was sent, so even an unkeyed effect is retried.
        dead = socket.create_server(("127.0.0.1", 0))
        port = dead.getsockname()[1]
        dead.close()
        with self.assertRaises(httpx.ConnectError):
            self.client().post(f"http://127.0.0.1:{port}/v1/charges", json={"a": 1})
        self.assertEqual(len(self.attempts), 5)
        self.assertEqual(len(self.slept), 4)
        # 429 says the request was not processed; an unkeyed 503 might have been.
        self.attempts.clear()
        self.upstream.script["/v1/charges"] = [(429, {"Retry-After": "1"}), (503, {})]
        r = self.client().post(self.url, json={"customer": "cus_4", "amount_cents": 5})
        self.assertEqual([a.status for a in self.attempts], [429, 503])
        self.assertEqual(r.status_code, 503)
        self.assertEqual(len(self.upstream.executions), 0)

    def test_a_key_needs_a_scope_and_a_given_key_is_sent_as_is(self):
        from idem_runtime import ScopeMissingError, scope
        from idem_runtime.http import call_info, intent

        with self.assertRaises(ScopeMissingError):
            self.client(scope=None).post(self.url, json={"a": 1}, extensions=intent("charge_card"))
        self.assertEqual(self.attempts, [])
        with scope("order-9"):
            r = self.client(scope=None).post(self.url, json={"a": 1}, extensions=intent("charge_card"))
        self.assertTrue(call_info(r).key.startswith("order_9-charge_card-"))
        r = self.client().post(self.url, json={"a": 2}, headers={"Idempotency-Key": "given-1"})
        again = self.client().post(self.url, json={"a": 2}, headers={"Idempotency-Key": "given-1"})
        self.assertEqual((call_info(r).key, call_info(again).replayed), ("given-1", True))
        self.assertNotIn("idempotency_key", self.upstream.executions[-1][2])
        self.assertEqual(len(self.upstream.executions), 2)

    def test_the_key_in_the_body_and_the_bare_header_are_the_callers_choice(self):
        from idem_runtime import ConfigurationError, derive_key
        from idem_runtime.http import IdempotentTransport, intent, request_intent

        args = {"customer": "cus_2", "amount_cents": 100}
        key = derive_key("run-7", "charge_card", request_intent("POST", self.url, args))
        self.client(key_header="bare").post(self.url, json=args, extensions=intent("charge_card"))
        _, headers, body = self.upstream.executions[-1]
        self.assertEqual((headers["idempotency-key"], body), (key, args))
        # The gateway reads both spellings as one key: the quoted form replays the bare one.
        again = self.client().post(self.url, json=args, extensions=intent("charge_card"))
        self.assertEqual(again.headers.get("idempotent-replayed"), "true")
        self.assertEqual(len(self.upstream.executions), 1)
        # In the body too, when asked (the fingerprint then covers it: keep one setting per service).
        other = {"customer": "cus_3", "amount_cents": 100}
        self.client(key_in_body=True).post(self.url, json=other, extensions=intent("charge_card"))
        key = derive_key("run-7", "charge_card", request_intent("POST", self.url, other))
        self.assertEqual(self.upstream.executions[-1][2], {**other, "idempotency_key": key})
        with self.assertRaises(ConfigurationError) as e:
            IdempotentTransport(key_header="quoted")
        self.assertIn("'sf-string'", str(e.exception))


class AsyncThroughTheGateway(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        require(self, WHY)
        start(self)
        # Built here: httpx loads its CA bundle when a transport is made, a blocking step.
        self.inner = httpx.AsyncHTTPTransport()

    async def test_a_lost_answer_is_retried_with_the_same_key_and_replayed(self):
        import anyio

        from idem_runtime.http import AsyncIdempotentTransport, RetryPolicy, call_info, intent

        proxy, upstream = self.proxy, self.upstream
        proxy.drops = 1
        slept = []

        async def sleep(d):
            slept.append(d)
            await anyio.sleep(d)

        transport = AsyncIdempotentTransport(self.inner, scope="run-8", retry=RetryPolicy(base=0.05, cap=0.5), sleep=sleep)
        async with httpx.AsyncClient(transport=transport, headers=PRINCIPAL, timeout=30) as client:
            r = await client.post(f"http://127.0.0.1:{proxy.port}/v1/charges",
                                   json={"customer": "cus_a", "amount_cents": 700}, extensions=intent("charge_card"))
            unknown = None
            proxy.drops = 1
            try:
                await client.post(f"http://127.0.0.1:{proxy.port}/v1/charges", json={"customer": "cus_b"})
            except httpx.TransportError as e:
                unknown = e
        self.assertEqual(r.status_code, 201)
        self.assertTrue(call_info(r).replayed)
        self.assertGreaterEqual(len(slept), 1)
        self.assertEqual(type(unknown).__name__, "HTTPOutcomeUnknownError")
        self.assertEqual(len(upstream.executions), 2, "one charge per intent; the unkeyed one not repeated")


if __name__ == "__main__":
    unittest.main()
