"""The official ``stripe`` Python SDK, a client nobody here wrote, against the example FastAPI
payment service with the ASGI middleware (examples/services/python), through a link that
loses answers after the service acted. The SDK sends an ``Idempotency-Key`` on every POST and
retries lost answers with it: exactly one charge per call. Without the middleware the same
retries charge again. With ``[problems] format = "stripe"``, refusals are in Stripe's envelope,
and the SDK raises its own ``IdempotencyError`` for a reused key and for a conflict in flight,
where an RFC 9457 document would be read as a charge with no id.
"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

from cli_support import REPO, REQUIRED
from net_support import FlakyProxy, free_port, require

SERVICES = REPO / "examples" / "services" / "python"

try:
    import stripe  # noqa: F401
    import fastapi  # noqa: F401
    import uvicorn  # noqa: F401

    WHY = None
except ImportError as e:  # pragma: no cover
    WHY = f"the stripe SDK, FastAPI or uvicorn is not installed ({e}; pip install -r tests/requirements.txt)"

CONFIG = """
[problems]
format = "stripe"
[[routes]]
method = "POST"
path = "/v1/charges"
"""


class Service:
    """The example FastAPI service on a free port, with or without idem."""

    def __init__(self, test: unittest.TestCase, idem: bool) -> None:
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="idem-stripe-"))
        self.ledger = self.dir / "ledger.jsonl"
        config = self.dir / "idem.toml"
        config.write_text(CONFIG)
        self.port = free_port()
        env = {
            **os.environ,
            "PORT": str(self.port),
            "LEDGER": str(self.ledger),
            "IDEM_CONFIG": str(config) if idem else "off",
            "IDEM_STORE": f"sqlite:{self.dir / 'idem.db'}",
        }
        uvicorn_bin = pathlib.Path(sys.executable).with_name("uvicorn")
        self.proc = subprocess.Popen(
            [str(uvicorn_bin), "fastapi_app:app", "--host", "127.0.0.1", "--port", str(self.port), "--no-access-log"],
            cwd=SERVICES, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        test.addCleanup(lambda: (self.proc.kill(), self.proc.wait()))
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/charges", timeout=1).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the example service did not start"
                assert self.proc.poll() is None, "the example service exited"
                time.sleep(0.1)

    def charges(self) -> int:
        if not self.ledger.exists():
            return 0
        with open(self.ledger, encoding="utf-8") as f:
            return sum(1 for _ in f)


def client(port: int, retries: int):
    import stripe

    return stripe.StripeClient(
        "sk_test_idem_0123456789",
        base_addresses={"api": f"http://127.0.0.1:{port}"},
        max_network_retries=retries,
    )


class StripeThroughALossyLink(unittest.TestCase):
    def setUp(self) -> None:
        require(self, WHY)

    def charge_through_loss(self, idem: bool, calls: int = 40, loss: float = 0.3) -> tuple:
        svc = Service(self, idem)
        flaky = FlakyProxy(svc.port, only=b"POST /v1/charges")
        self.addCleanup(flaky.close)
        sdk = client(flaky.port, retries=8)
        rng = random.Random(42)
        for i in range(calls):
            # This call's answer is lost after the service charged.
            flaky.drops = 1 if rng.random() < loss else 0
            charge = sdk.v1.charges.create(params={"amount": 100 + i, "currency": "usd", "customer": f"cus_{i}"})
            self.assertTrue(charge.id.startswith("ch_"), charge)
        return svc.charges(), flaky.dropped

    def test_every_call_charges_once_where_naive_retries_charge_again(self) -> None:
        with_idem, lost = self.charge_through_loss(idem=True)
        self.assertGreater(lost, 0, "the link lost answers")
        self.assertEqual(with_idem, 40, f"{lost} answers lost, retried by the SDK with its key")
        without, lost_too = self.charge_through_loss(idem=False)
        self.assertEqual(without, 40 + lost_too, "without idem every lost answer's retry charged again")
        print(f"\n40 calls: {lost} answers lost, {with_idem} charges with idem; {lost_too} lost, {without} charges without", file=sys.stderr)


class StripeReadsRefusals(unittest.TestCase):
    def setUp(self) -> None:
        require(self, WHY)
        self.svc = Service(self, idem=True)

    def test_a_reused_key_raises_the_sdks_idempotency_error(self) -> None:
        import stripe

        sdk = client(self.svc.port, retries=0)
        first = sdk.v1.charges.create(params={"amount": 4900, "currency": "usd"}, options={"idempotency_key": "order-7"})
        again = sdk.v1.charges.create(params={"amount": 4900, "currency": "usd"}, options={"idempotency_key": "order-7"})
        self.assertEqual(again.id, first.id, "the retry is the first charge")
        with self.assertRaises(stripe.IdempotencyError) as raised:
            sdk.v1.charges.create(params={"amount": 100, "currency": "usd"}, options={"idempotency_key": "order-7"})
        self.assertEqual(raised.exception.http_status, 400)
        self.assertEqual(self.svc.charges(), 1)

    def test_a_conflict_in_flight_raises_the_sdks_idempotency_error_after_its_retries(self) -> None:
        import stripe

        slow = {"amount": 4900, "currency": "usd", "simulate": "slow", "delay_ms": 8000}
        first = threading.Thread(
            target=lambda: client(self.svc.port, retries=0).v1.charges.create(params=slow, options={"idempotency_key": "order-8"}),
            daemon=True,
        )
        first.start()
        deadline = time.monotonic() + 20
        while self.svc.charges() == 0:
            self.assertLess(time.monotonic(), deadline, "the first request never charged")
            time.sleep(0.05)
        # Stripe-Should-Retry: true makes the SDK retry (it waited); still in flight, it raises.
        with self.assertRaises(stripe.IdempotencyError) as raised:
            client(self.svc.port, retries=1).v1.charges.create(params=slow, options={"idempotency_key": "order-8"})
        self.assertEqual(raised.exception.http_status, 400)
        self.assertIn("in-flight", str(raised.exception.json_body))
        first.join(30)
        self.assertEqual(self.svc.charges(), 1)


if __name__ == "__main__":
    unittest.main()
