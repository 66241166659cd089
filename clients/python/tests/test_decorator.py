"""@idempotent's semantics: which exceptions release, keep or mark unknown; key fields; an
explicit key; a scope handed to another process; a duplicate in flight; on_abandoned."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
import uuid

from cli_support import subprocess_env

from idem_runtime import (
    ConfigurationError,
    InFlightError,
    KeyMismatchError,
    OutcomeUnknownError,
    ReplayedError,
    Scope,
    ScopeMissingError,
    derive_key,
    idempotent,
    scope,
)


class CardDeclined(Exception):
    def __init__(self, code: str, amount: int) -> None:
        super().__init__(code, amount)
        self.code, self.amount = code, amount


class Unrebuildable(Exception):
    def __init__(self, *, code: str) -> None:
        super().__init__(f"code {code}")


def unique() -> str:
    return "t" + uuid.uuid4().hex[:12]


class Exceptions(unittest.TestCase):
    def test_default_releases_so_the_retry_runs(self):
        calls = []

        @idempotent(store="memory:", scope=unique())
        def send(to: str) -> str:
            calls.append(to)
            if len(calls) == 1:
                raise ConnectionError("smtp refused before sending")
            return "sent"

        with self.assertRaises(ConnectionError):
            send("a@example.com")
        value, outcome = send.call_with_outcome("a@example.com")
        self.assertEqual(value, "sent")
        self.assertFalse(outcome.replayed)
        self.assertEqual(calls, ["a@example.com", "a@example.com"])
        value, outcome = send.call_with_outcome("a@example.com")
        self.assertTrue(outcome.replayed)
        self.assertEqual(len(calls), 2)

    def test_a_kept_exception_is_replayed_as_raised(self):
        calls = []

        @idempotent(store="memory:", scope=unique(), keep_errors=[CardDeclined, Unrebuildable])
        def charge(amount: int) -> dict:
            calls.append(amount)
            if amount > 100:
                raise CardDeclined("insufficient_funds", amount)
            raise Unrebuildable(code="x")

        with self.assertRaises(CardDeclined) as first:
            charge(500)
        with self.assertRaises(CardDeclined) as again:
            charge(500)
        self.assertIsNot(again.exception, first.exception)
        self.assertEqual((again.exception.code, again.exception.amount), ("insufficient_funds", 500))
        self.assertEqual(calls, [500])
        # A class that cannot be rebuilt from its args comes back as ReplayedError, named.
        with self.assertRaises(Unrebuildable):
            charge(1)
        with self.assertRaises(ReplayedError) as cm:
            charge(1)
        self.assertTrue(cm.exception.type_name.endswith("Unrebuildable"))
        self.assertIn("code x", str(cm.exception))
        self.assertEqual(calls, [500, 1])

    def test_an_unknown_error_makes_the_retry_raise_outcome_unknown(self):
        calls = []

        @idempotent(store="memory:", scope=unique(), unknown_errors=[TimeoutError])
        def pay(amount: int) -> str:
            calls.append(amount)
            raise TimeoutError("the payment API did not answer")

        with self.assertRaises(TimeoutError):
            pay(10)
        with self.assertRaises(OutcomeUnknownError) as cm:
            pay(10)
        self.assertEqual(calls, [10])
        self.assertIn("idem resolve", str(cm.exception))
        self.assertIn(cm.exception.key, str(cm.exception))

    def test_on_abandoned_retry_runs_again(self):
        calls = []

        @idempotent(store="memory:", scope=unique(), unknown_errors=[TimeoutError], on_abandoned="retry")
        def pay(amount: int) -> str:
            calls.append(amount)
            if len(calls) == 1:
                raise TimeoutError("lost")
            return "paid"

        with self.assertRaises(TimeoutError):
            pay(10)
        value, outcome = pay.call_with_outcome(10)
        self.assertEqual((value, outcome.replayed), ("paid", False))
        self.assertEqual(calls, [10, 10])
        self.assertEqual(pay.call_with_outcome(10)[1].replayed, True)

    def test_cancelled_async_call_marks_unknown(self):
        started = []

        @idempotent(store="memory:", scope=unique())
        async def pay(amount: int) -> str:
            started.append(amount)
            await asyncio.Event().wait()  # never set: cancelled mid-effect
            return "paid"

        async def scenario():
            task = asyncio.create_task(pay(5))
            while not started:
                await asyncio.sleep(0.01)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            with self.assertRaises(OutcomeUnknownError):
                await pay(5)

        asyncio.run(scenario())
        self.assertEqual(started, [5])

    def test_async_replays(self):
        calls = []

        @idempotent(store="memory:", scope=unique())
        async def pay(amount: int) -> dict:
            calls.append(amount)
            return {"paid": amount}

        async def scenario():
            a = await pay.call_with_outcome(3)
            b = await pay.call_with_outcome(3)
            return a, b

        (v1, o1), (v2, o2) = asyncio.run(scenario())
        self.assertEqual((v1, v2), ({"paid": 3}, {"paid": 3}))
        self.assertEqual((o1.replayed, o2.replayed, o1.key), (False, True, o2.key))
        self.assertEqual(calls, [3])


class KeyFields(unittest.TestCase):
    def test_noise_outside_the_fields_is_ignored(self):
        calls = []

        @idempotent(store="memory:", scope=unique(), key_fields=["customer", "amount"])
        def charge(customer: str, amount: int, note: str = "", at: object = None) -> int:
            calls.append(note)
            return len(calls)

        self.assertEqual(charge("cus_1", 100, note="first wording", at=object()), 1)
        value, outcome = charge.call_with_outcome("cus_1", 100, note="rephrased by the model")
        self.assertEqual((value, outcome.replayed), (1, True))
        self.assertEqual(charge("cus_1", 200, note="x"), 2)  # another intent
        self.assertEqual(calls, ["first wording", "x"])

    def test_an_explicit_key_with_other_key_fields_is_a_mismatch(self):
        calls = []

        @idempotent(store="memory:", key_fields=["customer", "amount"])
        def charge(customer: str, amount: int, note: str = "") -> int:
            calls.append(amount)
            return amount

        key = f"{unique()}-charge-explicit"
        self.assertEqual(charge("cus_1", 100, note="a", idempotency_key=key), 100)
        # The fingerprint covers the key fields only: other noise under the key replays...
        self.assertEqual(charge.call_with_outcome("cus_1", 100, note="b", idempotency_key=key)[1].replayed, True)
        # ...another amount under the same key is refused.
        with self.assertRaises(KeyMismatchError) as cm:
            charge("cus_1", 999, idempotency_key=key)
        self.assertEqual(cm.exception.key, key)
        self.assertEqual(calls, [100])

    def test_nested_fields(self):
        @idempotent(store="memory:", scope=unique(), key_fields=["order.id"])
        def ship(order: dict) -> str:
            return order["id"]

        _, first = ship.call_with_outcome({"id": "o1", "comment": "a"})
        _, second = ship.call_with_outcome({"id": "o1", "comment": "b"})
        self.assertEqual((first.replayed, second.replayed, first.key), (False, True, second.key))


class ExplicitKeyAndScope(unittest.TestCase):
    def test_explicit_key_is_used_as_is_and_not_passed_on(self):
        seen = []

        @idempotent(store="memory:")
        def act(x: int) -> int:
            seen.append(x)
            return x

        key = f"{unique()}-act-1"
        value, outcome = act.call_with_outcome(1, idempotency_key=key)
        self.assertEqual((value, outcome.key), (1, key))
        self.assertEqual(act.call_with_outcome(1, idempotency_key=key)[1].replayed, True)
        self.assertEqual(seen, [1])

    def test_a_function_taking_the_key_receives_it(self):
        @idempotent(store="memory:")
        def act(x: int, idempotency_key: str = "") -> str:
            return idempotency_key

        key = f"{unique()}-act-2"
        self.assertEqual(act(1, idempotency_key=key), key)

    def test_no_scope_is_an_error_that_says_what_to_do(self):
        @idempotent(store="memory:")
        def act(x: int) -> int:
            return x

        with self.assertRaises(ScopeMissingError) as cm:
            act(1)
        self.assertIn("scope(", str(cm.exception))

    def test_the_key_is_derive_key_of_the_bound_arguments(self):
        run = unique()

        @idempotent(store="memory:")
        def charge(customer: str, amount: int = 5, *, currency: str = "eur") -> None:
            return None

        with scope(run):
            _, outcome = charge.call_with_outcome("c", currency="usd")
        expected = derive_key(run, "charge", {"customer": "c", "amount": 5, "currency": "usd"})
        self.assertEqual(outcome.key, expected)

    def test_a_method_keys_what_its_instance_says(self):
        """Issue 60, item 2: two instances configured apart are two intents; two classes'
        same-named methods are two tools; a method taking self needs instance_key."""
        db = os.path.join(tempfile.mkdtemp(), "idem.db")

        class Gateway:
            def __init__(self, account):
                self.account = account
                self.runs = 0

            # Through a real store, a file: one execution per intent.
            @idempotent(store=f"sqlite:{db}", scope=unique(), instance_key=lambda self: self.account)
            def refund(self, charge: str) -> str:
                self.runs += 1
                return f"{self.account}:{charge}"

        a, b, a_again = Gateway("acct_A"), Gateway("acct_B"), Gateway("acct_A")
        self.assertEqual(a.refund("ch_1"), "acct_A:ch_1")
        self.assertEqual(b.refund("ch_1"), "acct_B:ch_1")  # B's refund runs
        # Another instance of the same account, one intent: a replay.
        value, outcome = Gateway.refund.call_with_outcome(a_again, "ch_1")
        self.assertEqual((value, outcome.replayed, a_again.runs), ("acct_A:ch_1", True, 0))

        run = unique()

        class Stripe:
            @idempotent(store=f"sqlite:{db}", scope=run, instance_key=lambda self: None)
            def pay(self, customer: str, amount: int) -> dict:
                return {"psp": "stripe"}

        class Paypal:
            @idempotent(store=f"sqlite:{db}", scope=run, instance_key=lambda self: None)
            def pay(self, customer: str, amount: int) -> dict:
                return {"psp": "paypal"}

        self.assertEqual(Stripe().pay("cus_1", 100), {"psp": "stripe"})
        self.assertEqual(Paypal().pay("cus_1", 100), {"psp": "paypal"})
        with self.assertRaisesRegex(ConfigurationError, "instance_key"):

            class Unsaid:
                @idempotent(store="memory:")
                def send(self, to: str) -> None:
                    return None

    def test_static_methods_of_two_classes_are_two_tools(self):
        run = unique()

        class Stripe:
            @staticmethod
            @idempotent(store="memory:", scope=run)
            def refund(charge: str) -> str:
                return f"stripe {charge}"

        class Adyen:
            @staticmethod
            @idempotent(store="memory:", scope=run)
            def refund(charge: str) -> str:
                return f"adyen {charge}"

        self.assertEqual((Stripe.refund("ch_1"), Adyen.refund("ch_1")), ("stripe ch_1", "adyen ch_1"))

    def test_a_function_named_with_self_keeps_it(self):
        """Item 8: only a real method's receiver is set apart; a plain function's first
        argument named self is part of its intent."""

        @idempotent(store="memory:", scope=unique())
        def classify(self, n):
            return [self, n]

        self.assertEqual(classify("gold", 5), ["gold", 5])
        self.assertEqual(classify("silver", 5), ["silver", 5])

    def test_partials_and_lambdas_are_named_and_keyed_whole(self):
        """Item 7: a partial's bound arguments are in its intent; a lambda or a partial must
        be named."""
        import functools

        def base(a, b):
            return [a, b]

        with self.assertRaisesRegex(ConfigurationError, "tool="):
            idempotent(functools.partial(base, 1), store="memory:")
        with self.assertRaisesRegex(ConfigurationError, "tool="):
            idempotent(lambda x: x, store="memory:")
        run = unique()
        one = idempotent(functools.partial(base, 1), store="memory:", tool="base", scope=run)
        nine = idempotent(functools.partial(base, 9), store="memory:", tool="base", scope=run)
        self.assertEqual((one(2), nine(2)), ([1, 2], [9, 2]))

    def test_variadic_signatures(self):
        @idempotent(store="memory:", scope=unique())
        def f(a, *rest, flag=False, **extra) -> list:
            return [a, list(rest), flag, extra]

        first = f.call_with_outcome(1, 2, 3, flag=True, x=1)
        second = f.call_with_outcome(1, 2, 3, flag=True, x=1)
        self.assertEqual((first[1].replayed, second[1].replayed), (False, True))
        self.assertNotEqual(f.call_with_outcome(1, 2, flag=True, x=1)[1].key, first[1].key)
        with self.assertRaises(TypeError):
            f()

    def test_bad_calls_raise_type_error_before_anything_runs(self):
        @idempotent(store="memory:", scope=unique())
        def f(a, b=1):
            raise AssertionError("must not run")

        for args, kwargs in [((), {}), ((1, 2, 3), {}), ((1,), {"a": 1}), ((1,), {"c": 2})]:
            with self.assertRaises(TypeError):
                f(*args, **kwargs)

    def test_a_serialised_scope_derives_the_same_key_in_another_process(self):
        with tempfile.TemporaryDirectory() as tmp:
            store = f"sqlite:{tmp}/idem.db"
            effects = os.path.join(tmp, "effects.txt")
            code = textwrap.dedent(
                f"""
                import json, sys
                from idem_runtime import Scope, idempotent, scope

                @idempotent(store={store!r})
                def send(to: str) -> str:
                    with open({effects!r}, "a") as f:
                        f.write(to + "\\n")
                    return "sent to " + to

                with scope(Scope.loads(sys.argv[1])):
                    value, outcome = send.call_with_outcome("a@example.com")
                print(json.dumps([value, outcome.key, outcome.replayed]))
                """
            )
            with scope(f"order-{unique()}") as s:
                handed = s.child("mailer").dumps()
            import json

            runs = [
                json.loads(
                    subprocess.run(
                        [sys.executable, "-c", code, handed],
                        capture_output=True, text=True, check=True, env=subprocess_env(), timeout=60,
                    ).stdout
                )
                for _ in range(2)
            ]
            self.assertEqual(runs[0][:2], runs[1][:2])
            self.assertEqual((runs[0][2], runs[1][2]), (False, True))
            self.assertEqual(runs[0][1], derive_key(Scope.loads(handed), "send", {"to": "a@example.com"}))
            with open(effects) as f:
                self.assertEqual(f.read(), "a@example.com\n")


class InFlight(unittest.TestCase):
    def in_flight(self, wait, store="memory:", **options):
        release, entered = threading.Event(), threading.Event()
        calls = []

        @idempotent(store=store, scope=unique(), wait=wait, **options)
        def slow(x: int) -> int:
            calls.append(x)
            entered.set()
            release.wait(30)
            return x * 10

        results = []
        worker = threading.Thread(target=lambda: results.append(slow(1)))
        worker.start()
        self.assertTrue(entered.wait(30))
        return slow, release, worker, results, calls

    def test_wait_zero_raises_in_flight_at_once(self):
        slow, release, worker, results, calls = self.in_flight(0)
        try:
            with self.assertRaises(InFlightError) as cm:
                slow(1)
            self.assertIn("held by another call", str(cm.exception))
        finally:
            release.set()
            worker.join()
        self.assertEqual(results, [10])
        self.assertEqual(slow.call_with_outcome(1), (10, unittest.mock.ANY))
        self.assertEqual(calls, [1])

    def test_a_waiting_duplicate_gets_the_result(self):
        slow, release, worker, results, calls = self.in_flight(30)
        got = []
        dup = threading.Thread(target=lambda: got.append(slow.call_with_outcome(1)))
        dup.start()
        release.set()
        worker.join()
        dup.join()
        self.assertEqual(got[0][0], 10)
        self.assertTrue(got[0][1].replayed)
        self.assertEqual(calls, [1])

    def test_a_call_longer_than_its_lease_stays_in_flight(self):
        # The heartbeat extends the lease while the function runs (started only once the call
        # outlives a third of it): a duplicate after 2.5 leases is told the call is in flight,
        # not that its outcome is unknown, and nothing runs twice.
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        slow, release, worker, results, calls = self.in_flight(0, f"sqlite:{tmp.name}/idem.db", lease=1)
        try:
            time.sleep(2.5)
            with self.assertRaises(InFlightError):
                slow(1)
        finally:
            release.set()
            worker.join()
        self.assertEqual(results, [10])
        self.assertEqual(slow(1), 10)
        self.assertEqual(calls, [1])


import unittest.mock  # noqa: E402

if __name__ == "__main__":
    unittest.main()
