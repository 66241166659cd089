"""derive_key: every vector of docs/key-vectors.json, and agreement with the Rust CLI's
`idem key` on a few hundred random arguments (with and without key fields)."""

from __future__ import annotations

import json
import os
import random
import tempfile
import unittest

from cli_support import REPO, cli_missing, idem, need

from idem_runtime import KeyDerivationError, Scope, derive_key, idempotent

VECTORS = json.loads((REPO / "docs" / "key-vectors.json").read_text())["vectors"]


class Vectors(unittest.TestCase):
    def test_every_vector(self):
        self.assertGreater(len(VECTORS), 30)
        for v in VECTORS:
            with self.subTest(v["name"]):
                args = json.loads(v["args_json"])
                secret = bytes.fromhex(v["secret_hex"]) if v["secret_hex"] is not None else None
                if "error" in v:
                    with self.assertRaises(KeyDerivationError) as cm:
                        derive_key(v["scope"], v["tool"], args, ordinal=v["ordinal"], secret=secret)
                    self.assertIn(v["error"], str(cm.exception))
                else:
                    got = derive_key(v["scope"], v["tool"], args, ordinal=v["ordinal"], secret=secret)
                    self.assertEqual(got, v["key"])

    def test_scope_object_and_str_secret(self):
        v = next(v for v in VECTORS if v["name"] == "basic")
        args = json.loads(v["args_json"])
        self.assertEqual(derive_key(Scope(v["scope"]), v["tool"], args), v["key"])
        self.assertNotEqual(derive_key(v["scope"], v["tool"], args, secret="s"), v["key"])
        self.assertEqual(
            derive_key(v["scope"], v["tool"], args, secret="s"),
            derive_key(v["scope"], v["tool"], args, secret=b"s"),
        )


class Errors(unittest.TestCase):
    def check(self, args, needle, **kw):
        with self.assertRaises(KeyDerivationError) as cm:
            derive_key("run", "tool", args, **kw)
        self.assertIn(needle, str(cm.exception))
        self.assertIsInstance(cm.exception, ValueError)

    def test_integers_beyond_2_53(self):
        self.check({"id": 2**53 + 1}, "2^53")
        self.check({"id": -(2**53) - 1}, "2^53")
        self.check([[{"deep": 2**64}]], "2^53")
        derive_key("run", "tool", {"id": 2**53})

    def test_nan_and_infinity(self):
        for bad in (float("nan"), float("inf"), float("-inf")):
            self.check({"x": bad}, "key")
            self.check({"x": [1, {"y": bad}]}, "key")

    def test_lone_surrogates(self):
        self.check({"s": "\ud800"}, "surrogate")
        self.check({"s": "a\udc00b"}, "surrogate")
        self.check({"\ud83d": 1}, "surrogate")

    def test_missing_key_field(self):
        self.check({"customer": "c"}, "amount", key_fields=["amount"])
        self.check({"order": {"id": 1}}, "order.sku", key_fields=["order.sku"])
        self.check({"a": 1}, "", key_fields=[])

    def test_not_json(self):
        self.check({"x": object()}, "key_fields")

    def test_bad_ordinal(self):
        for bad in (-1, True, 1.5, 2**53 + 1):
            with self.assertRaises(KeyDerivationError):
                derive_key("run", "tool", {}, ordinal=bad)


ALPHABET = "ab_Z09 \"\\/\n\t\u00e9\u4e2d\U0001f600\u0301\x00\x7f"


def random_string(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8)))


def random_number(rng: random.Random):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randint(-(2**53), 2**53)
    if kind == 1:
        return rng.randint(-1000, 1000)
    if kind == 2:
        return rng.uniform(-1e6, 1e6)
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.0, 0.1, 1e-7, 5e-324, 1.7976931348623157e308, 1e21, 123e-20])
    if kind == 4:
        return float(rng.randint(-(2**53), 2**53))
    return rng.random() * 10 ** rng.randint(-300, 300)


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return random_number(rng)
    if kind in (3, 4):
        return random_string(rng)
    if kind == 5:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_string(rng): random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def random_args(rng: random.Random) -> dict:
    args = {random_string(rng) or "k": random_json(rng) for _ in range(rng.randint(0, 5))}
    if rng.random() < 0.2:
        args["idempotency_key"] = "ignored"
    return args


class DecoratorKeys(unittest.TestCase):
    """The decorator hands plain arguments to the native side as objects and anything else
    as JSON text: both paths must give derive_key's key (and its errors)."""

    def test_random_arguments_by_both_paths(self):
        import datetime
        import enum

        class Level(enum.IntEnum):
            HIGH = 3

        @idempotent(store="memory:", scope="run-dk")
        def tool(payload, *rest, **extra):
            return None

        rng = random.Random(99)
        exotic = [datetime.date(2026, 1, 2), Level.HIGH, {1: "int key"}, (1, "t"), 2**70, float("nan"), "\ud800"]
        for i in range(400):
            payload = random_json(rng)
            if rng.random() < 0.2:
                payload = [payload, rng.choice(exotic)]
            extra = {random_string(rng) or "x": random_json(rng) for _ in range(rng.randint(0, 3))}
            extra.pop("idempotency_key", None)
            extra.pop("payload", None)
            expected_args = dict(extra, payload=payload, rest=[])
            with self.subTest(i=i):
                try:
                    expected = derive_key("run-dk", "tool", expected_args)
                except KeyDerivationError:
                    with self.assertRaises(KeyDerivationError):
                        tool(payload, **extra)
                    continue
                self.assertEqual(tool.call_with_outcome(payload, **extra)[1].key, expected)


@need(cli_missing())
class AgainstTheCli(unittest.TestCase):
    """The native derivation and the CLI's are one crate; this checks the Python side's JSON
    (numbers, escapes, key order) reaches it intact."""

    def test_random_arguments(self):
        rng = random.Random(20261130)
        env = dict(os.environ, IDEM_TEST_SECRET="s3cret \u00e9")
        agreed = 0
        tmp = self.enterContext(tempfile.TemporaryDirectory()) if hasattr(self, "enterContext") else tempfile.mkdtemp()
        for i in range(300):
            args = random_args(rng) if rng.random() < 0.8 else random_json(rng)
            scope = rng.choice(["run_1", "order-42", "t\u00e2che/7", random_string(rng).replace("\0", "") or "s"])
            tool = rng.choice(["charge_card", "send_email", "x"])
            ordinal = rng.choice([0, 0, 1, 7, 2**53])
            secret = rng.random() < 0.25
            text = json.dumps(args, ensure_ascii=rng.random() < 0.5)
            path = os.path.join(tmp, "args.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            cli = ["key", "--scope", scope, "--tool", tool, "--args", "@" + path, "--ordinal", str(ordinal)]
            if secret:
                cli += ["--secret-env", "IDEM_TEST_SECRET"]
            with self.subTest(i=i, args=text):
                p = idem(*cli, env=env, check=False)
                derive = lambda: derive_key(  # noqa: E731
                    scope, tool, args, ordinal=ordinal, secret=env["IDEM_TEST_SECRET"] if secret else None
                )
                if p.returncode == 0:
                    self.assertEqual(derive(), p.stdout.strip())
                    agreed += 1
                else:
                    # Both refuse it (a float that is an integer beyond 2^53, say).
                    self.assertIn("2^53", p.stderr)
                    with self.assertRaises(KeyDerivationError):
                        derive()
        self.assertGreater(agreed, 200)

    def test_key_fields_derive_from_the_selection(self):
        """With key fields the key is the CLI's key of {"<field>": value, ...}: noise outside
        the fields changes nothing."""
        rng = random.Random(7)

        def keyable():
            # Values inside a selected top-level argument are parsed with it, so they must be
            # keyable too (no float that is an integer beyond 2^53).
            while True:
                v = random_json(rng)
                if "e+" not in json.dumps(v) and "1.7976931348623157e308" not in repr(v):
                    return v

        for i in range(60):
            fields = {"customer": keyable(), "order": {"id": keyable(), "items": [keyable()]}}
            specs = rng.choice([["customer"], ["customer", "order.id"], ["/order/items/0"], ["order"]])
            args = dict(fields, note=random_string(rng), at=rng.random())
            selected = {}
            for spec in specs:
                value = args
                for part in (spec[1:].split("/") if spec.startswith("/") else spec.split(".")):
                    value = value[int(part)] if isinstance(value, list) else value[part]
                selected[spec] = value
            with self.subTest(i=i, specs=specs):
                p = idem("key", "--scope", "run", "--tool", "t", "--args", json.dumps(selected), check=False)
                if p.returncode != 0:
                    with self.assertRaises(KeyDerivationError):
                        derive_key("run", "t", args, key_fields=specs)
                    continue
                expected = p.stdout.strip()
                self.assertEqual(derive_key("run", "t", args, key_fields=specs), expected)
                noisy = dict(args, note="another wording", at=-1)
                self.assertEqual(derive_key("run", "t", noisy, key_fields=specs), expected)

    def test_invalid_arguments_the_cli_also_refuses(self):
        for text, value in [
            ('{"id": 9007199254740993}', {"id": 9007199254740993}),
            ('{"s": "\\ud800"}', {"s": "\ud800"}),
        ]:
            p = idem("key", "--scope", "r", "--tool", "t", "--args", text, check=False)
            self.assertNotEqual(p.returncode, 0)
            with self.assertRaises(KeyDerivationError):
                derive_key("r", "t", value)


if __name__ == "__main__":
    unittest.main()


class RequestIntents(unittest.TestCase):
    """Issue 60, item 4: an HTTP call's intent is its method, URL and body, so two customers'
    URLs with one body never share a key; one request written twice keeps one."""

    def keys_sent(self, *requests):
        import httpx

        from idem_runtime.http import IdempotentTransport, intent

        seen = []

        def answer(request):
            seen.append(request.headers.get("idempotency-key"))
            return httpx.Response(201, json={})

        client = httpx.Client(transport=IdempotentTransport(httpx.MockTransport(answer), scope="run-60"))
        for method, url, body in requests:
            client.request(method, url, json=body, extensions=intent("charge"))
        return seen

    def test_targets_are_part_of_the_intent(self):
        base = "http://api.test"
        args = {"amount_cents": 100}
        keys = self.keys_sent(
            ("POST", f"{base}/v1/customers/cus_1/charges", args),
            ("POST", f"{base}/v1/customers/cus_2/charges", args),
            ("POST", f"{base}/v1/charges?customer=cus_3", args),
            ("POST", f"{base}/v1/charges?customer=cus_4", args),
            ("PUT", f"{base}/v1/charges?customer=cus_4", args),
            ("POST", f"{base}/orders/o_1/cancel", None),
            ("POST", f"{base}/orders/o_2/cancel", None),
        )
        self.assertEqual(len(set(keys)), len(keys), keys)
        # One intent twice (a fragment is not sent): one key.
        again = self.keys_sent(("POST", f"{base}/v1/charges?customer=cus_3", args), ("POST", f"{base}/v1/charges?customer=cus_3#x", args))
        self.assertEqual(again[0], again[1])
        self.assertEqual(again[0], keys[2])

    def test_the_key_is_the_one_node_derives(self):
        from idem_runtime.http import request_intent

        # The same object Node's idemFetch keys (clients/js/tests/intent.test.mjs holds this key).
        intent = request_intent("post", "https://api.test/v1/charges?customer=cus_3#frag", {"amount_cents": 100})
        self.assertEqual(intent, {"method": "POST", "url": "https://api.test/v1/charges?customer=cus_3", "args": {"amount_cents": 100}})
        self.assertEqual(derive_key("run-60", "charge", intent), "run_60-charge-3k6bmxk6kiujd3eet5jubprgzl7fnclj")


class ScopeHandOff(unittest.TestCase):
    """Issue 60, item 11: one serialised scope, read and written by both languages."""

    def test_both_forms_read(self):
        self.assertEqual(Scope.loads('{"format":"idem-scope/v1","id":"order_7"}').id, "order_7")
        self.assertEqual(Scope.loads('{"idem_scope":"order_7"}').id, "order_7")
        self.assertEqual(json.loads(Scope("order_7").dumps()), {"format": "idem-scope/v1", "id": "order_7"})
        from idem_runtime import ConfigurationError

        for bad in ['{"id":"x"}', '{"idem_scope":7}', "[]"]:
            with self.assertRaises(ConfigurationError):
                Scope.loads(bad)


class FaithfulValues(unittest.TestCase):
    """Issue 60, items 10 and 12-22 (Python): what JSON would merge is refused, a set's key
    does not depend on the process, and the tool's own key_for gives the key its call gets."""

    def test_what_json_would_merge_is_refused(self):
        import decimal

        for bad in [{"m": {1: "a"}}, {"m": {1: "a", "1": "b"}}, {"d": decimal.Decimal("NaN")}, {"d": decimal.Decimal("-Infinity")}]:
            with self.assertRaises(KeyDerivationError, msg=repr(bad)):
                derive_key("run", "t", bad)

    def test_a_sets_key_is_the_same_in_every_process(self):
        import subprocess
        import sys

        code = (
            "from idem_runtime import derive_key;"
            "print(derive_key('r', 't', {'s': {frozenset({'a', 'b'}), frozenset({'c'}), frozenset({'d', 'e'})}, 'w': {'x', 'y', 'z'}}))"
        )
        keys = {
            subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(seed)}, capture_output=True, text=True, check=True).stdout
            for seed in (1, 2, 3, 4)
        }
        self.assertEqual(len(keys), 1, keys)

    def test_key_for_is_the_key_a_call_gets_defaults_and_all(self):
        from idem_runtime import scope

        @idempotent(store="memory:")
        def charge(customer: str, amount: int, note: str = "") -> int:
            return 1

        with scope("run_10"):
            key = charge.key_for("cus_1", 4900)
            _, outcome = charge.call_with_outcome("cus_1", 4900)
        self.assertEqual(key, outcome.key)
        # A dict written without the default is another intent's key: key_for is the one.
        self.assertEqual(key, derive_key("run_10", "charge", {"customer": "cus_1", "amount": 4900, "note": ""}))
        self.assertNotEqual(key, derive_key("run_10", "charge", {"customer": "cus_1", "amount": 4900}))


class RefusedAtTheSource(unittest.TestCase):
    def test_lone_surrogates_and_the_key_argument_as_a_field(self):
        from idem_runtime import ConfigurationError

        for scope_, tool in [("run\ud800", "t"), ("run", "t\udc00")]:
            with self.assertRaises(KeyDerivationError):
                derive_key(scope_, tool, {})
        with self.assertRaises(KeyDerivationError):
            idempotent(lambda: None, tool="t\ud800", store="memory:")
        for fields in (["idempotency_key"], ["/idempotency_key"], ["customer", "idempotency_key.x"]):
            with self.assertRaises(ConfigurationError, msg=fields):
                derive_key("run", "t", {"customer": "c"}, key_fields=fields)
        with self.assertRaises(TypeError):
            derive_key(None, "t", {})


class IntentProperties(unittest.TestCase):
    """Issue 60's property in Python: over random intents, different intents (values, types,
    tools, receivers, targets) get different keys; one intent written another way (keyword or
    positional, members in another order) keeps one."""

    def test_over_random_intents(self):
        from idem_runtime import scope
        from idem_runtime.http import request_intent

        rng = random.Random(60)

        def value(depth=0):
            r = rng.random()
            if depth > 2 or r < 0.3:
                return rng.randrange(1000)
            if r < 0.45:
                return f"s{rng.randrange(1000)}"
            if r < 0.55:
                return rng.random() < 0.5
            if r < 0.6:
                return None
            if r < 0.8:
                return [value(depth + 1) for _ in range(rng.randrange(3))]
            return {f"k{i}": value(depth + 1) for i in range(rng.randrange(3))}

        class Account:
            def __init__(self, name):
                self.name = name

            @idempotent(store="memory:", instance_key=lambda self: self.name)
            def pay(self, a, b=None):
                return None

        @idempotent(store="memory:")
        def pay(a, b=None):
            return None

        seen = {}
        with scope("run_prop"):
            for _ in range(300):
                a, b = value(), value()
                text = json.dumps([a, b], sort_keys=True)
                key = pay.key_for(a, b)
                self.assertEqual(pay.key_for(b=b, a=a), key)
                if isinstance(a, dict):
                    self.assertEqual(pay.key_for(dict(reversed(list(a.items()))), b), key)
                if key in seen:
                    self.assertEqual(seen[key], text, "two intents shared a key")
                seen[key] = text
                self.assertNotEqual(Account.pay.key_for(Account("x"), a, b), key)
                self.assertNotEqual(Account.pay.key_for(Account("x"), a, b), Account.pay.key_for(Account("y"), a, b))
                self.assertNotEqual(
                    derive_key("run_prop", "pay", request_intent("POST", "https://h/a", a)),
                    derive_key("run_prop", "pay", request_intent("POST", "https://h/b", a)),
                )


class ScopeForms(unittest.TestCase):
    def test_derive_key_reads_every_serialised_form(self):
        want = derive_key("order_7", "charge", {"a": 1})
        for form in ({"format": "idem-scope/v1", "id": "order_7"}, {"idem_scope": "order_7"}, Scope("order_7").dumps(), '{"idem_scope":"order_7"}', Scope("order_7")):
            self.assertEqual(derive_key(form, "charge", {"a": 1}), want, form)
        # An id that merely starts with "{" is an id.
        self.assertNotEqual(derive_key("{not json", "charge", {"a": 1}), want)
        from idem_runtime import ConfigurationError

        with self.assertRaises(ConfigurationError):
            derive_key({"idem_scope": "x", "extra": 1}, "charge", {})
