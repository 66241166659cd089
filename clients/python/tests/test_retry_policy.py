"""The retry policy the HTTP transport and the MCP helper share (the Rust client's numbers),
and the transport's decisions on answers no gateway gives on cue (httpx's MockTransport):
which statuses and failures are retried, with and without a key, and the bounds.

Run: cd clients/python && python -m unittest tests.test_retry_policy -v
"""

from __future__ import annotations

import json
import unittest

from net_support import require

try:
    import httpx
except ImportError:  # pragma: no cover - reported by need()
    httpx = None

WHY = None if httpx is not None else "httpx is not installed (pip install httpx)"


class Policy(unittest.TestCase):
    def test_backoff_doubles_up_to_the_cap_and_honours_retry_after(self):
        from idem_runtime._retry import RetryPolicy

        p = RetryPolicy(base=0.1, cap=0.35)
        self.assertEqual([round(p.backoff_bound(n), 3) for n in range(1, 6)], [0.1, 0.2, 0.35, 0.35, 0.35])
        self.assertEqual(p.backoff_bound(10_000), 0.35)
        for n in range(1, 6):
            for _ in range(100):
                self.assertLessEqual(p.delay(n), p.backoff_bound(n))
                self.assertGreaterEqual(p.delay(n, 2.0), 2.0)

    def test_the_defaults_are_the_rust_clients(self):
        from idem_runtime._retry import RetryPolicy

        self.assertEqual(RetryPolicy(), RetryPolicy(max_attempts=5, base=0.1, cap=10.0, max_total=60.0))

    def test_no_attempt_starts_after_the_total_bound(self):
        from idem_runtime._retry import Budget, RetryPolicy

        now = [0.0]
        budget = Budget(RetryPolicy(max_attempts=100, base=1.0, cap=1.0, max_total=5.0), clock=lambda: now[0])
        self.assertIsNotNone(budget.next_delay(1, None))
        now[0] = 4.5
        self.assertIsNone(budget.next_delay(2, 1.0), "4.5 s + a 1 s Retry-After is past 5 s")
        self.assertIsNone(Budget(RetryPolicy(max_attempts=2)).next_delay(2, None))

    def test_bad_settings_are_refused(self):
        from idem_runtime import ConfigurationError
        from idem_runtime._retry import RetryPolicy

        for bad in ({"max_attempts": 0}, {"base": -1}, {"cap": "10s"}):
            with self.assertRaises(ConfigurationError):
                RetryPolicy(**bad)

    def test_retry_after_is_seconds_capped_at_a_day(self):
        from idem_runtime._retry import parse_retry_after

        self.assertEqual(parse_retry_after(" 3 "), 3.0)
        self.assertEqual(parse_retry_after("999999"), 86_400.0)
        self.assertIsNone(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"))
        self.assertIsNone(parse_retry_after(None))


class Decisions(unittest.TestCase):
    def setUp(self):
        require(self, WHY)

    def run_script(self, script, method="POST", **kw):
        """Sends one request through the transport over a mock answering ``script`` in
        order (a status, or an exception class to raise); returns the attempts' record."""
        from idem_runtime.http import IdempotentTransport

        seen = []

        def answer(request):
            seen.append(request)
            step = script[min(len(seen), len(script)) - 1]
            if isinstance(step, type):
                raise step("scripted", request=request)
            return httpx.Response(step, json={"n": len(seen)})

        slept = []
        transport = IdempotentTransport(httpx.MockTransport(answer), scope="s", sleep=slept.append)
        with httpx.Client(transport=transport) as c:
            try:
                r = c.request(method, "http://api.test/v1/x", json={"a": 1}, **kw)
            except httpx.TransportError as e:
                r = e
        return r, seen, slept

    def keyed(self):
        from idem_runtime.http import intent

        return {"extensions": intent("x")}

    def test_with_a_key_409_429_5xx_and_failures_are_retried(self):
        r, seen, slept = self.run_script([409, 429, 500, httpx.ReadTimeout, 201], **self.keyed())
        self.assertEqual(r.status_code, 201)
        self.assertEqual(len(seen), 5)
        self.assertEqual(len(slept), 4)
        keys = {req.headers["idempotency-key"] for req in seen}
        self.assertEqual(len(keys), 1, "one key on every attempt")
        # The header carries it as an sf-string; the body goes as given (no idempotency_key).
        self.assertTrue(all(k.startswith('"') and k.endswith('"') for k in keys), keys)
        self.assertTrue(all("idempotency_key" not in json.loads(req.content) for req in seen))

    def test_other_4xx_end_the_call(self):
        for status in (400, 401, 404, 422):
            r, seen, slept = self.run_script([status, 201], **self.keyed())
            self.assertEqual((r.status_code, len(seen), slept), (status, 1, []))

    def test_attempts_run_out_on_the_last_answer(self):
        r, seen, _ = self.run_script([503], **self.keyed())
        self.assertEqual((r.status_code, len(seen)), (503, 5))
        r, seen, _ = self.run_script([httpx.ReadError], **self.keyed())
        self.assertIsInstance(r, httpx.ReadError)
        self.assertEqual(len(seen), 5)

    def test_an_unkeyed_effect_is_repeated_only_when_surely_not_sent(self):
        from idem_runtime.http import HTTPOutcomeUnknownError

        r, seen, _ = self.run_script([httpx.ConnectError, httpx.PoolTimeout, 429, 201])
        self.assertEqual((r.status_code, len(seen)), (201, 4))
        self.assertNotIn("idempotency-key", seen[0].headers)
        self.assertEqual(json.loads(seen[0].content), {"a": 1}, "an unkeyed body is sent as it was")
        for lost in (httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
            r, seen, _ = self.run_script([lost, 201])
            self.assertIsInstance(r, HTTPOutcomeUnknownError)
            self.assertIsInstance(r.__cause__, lost)
            self.assertEqual(len(seen), 1)
        for status in (409, 500, 503):
            r, seen, _ = self.run_script([status, 201])
            self.assertEqual((r.status_code, len(seen)), (status, 1))

    def test_reads_and_idempotent_methods_retry_without_a_key(self):
        for method in ("GET", "PUT", "DELETE"):
            r, seen, _ = self.run_script([httpx.ReadTimeout, 503, 200], method=method)
            self.assertEqual((r.status_code, len(seen)), (200, 3))
            self.assertNotIn("idempotency-key", seen[0].headers)

    def test_conflicting_keys_are_refused_before_sending(self):
        from idem_runtime import ConfigurationError
        from idem_runtime.http import intent

        with self.assertRaises(ConfigurationError):
            self.run_script([201], headers={"Idempotency-Key": "a"}, extensions=intent("x", key="b"))
        for bad in ("", "a b", "ключ", "k" * 256):
            with self.assertRaises(ConfigurationError):
                self.run_script([201], extensions=intent("x", key=bad))
        r, seen, _ = self.run_script([201], headers={"Idempotency-Key": '"k\\"1"'})
        self.assertEqual(__import__("idem_runtime.http", fromlist=["call_info"]).call_info(r).key, 'k"1', "an sf-string header is unquoted")
        self.assertEqual(seen[0].headers["idempotency-key"], '"k\\"1"', "and sent quoted again")


if __name__ == "__main__":
    unittest.main()
