"""Adversarial input: arguments that must get a clear typed error instead of a shared key or
a stray exception."""

from __future__ import annotations

import unittest
import uuid

from idem_runtime import ConfigurationError, KeyDerivationError, idempotent


def unique() -> str:
    return "t" + uuid.uuid4().hex[:12]


class HostileArguments(unittest.TestCase):
    def test_a_keyword_named_like_star_args_is_not_merged_over_it(self):
        calls = []

        @idempotent(store="memory:", scope=unique())
        def f(*args, **kwargs):
            calls.append((args, kwargs))
            return len(calls)

        try:
            first, second = f(1, args=2), f(3, args=2)
        except KeyDerivationError:
            self.assertEqual(calls, [], "refused, but only after running")
            return
        # Two intents (other positional arguments): the second must not replay the first.
        self.assertEqual((first, second), (1, 2), "f(3, args=2) replayed f(1, args=2)")

    def test_arguments_nested_beyond_the_recursion_limit_are_a_typed_error(self):
        @idempotent(store="memory:", scope=unique())
        def h(x):
            raise AssertionError("must not run")

        deep: dict = {}
        node = deep
        for _ in range(100_000):
            node["a"] = {}
            node = node["a"]
        with self.assertRaises(KeyDerivationError):
            h(deep)


class ExplicitKeyNone(unittest.TestCase):
    def test_idempotency_key_none_means_derive_it(self):
        @idempotent(store="memory:", scope=unique())
        def f(x):
            return x

        self.assertEqual(f(1, idempotency_key=None), 1)



class BadOptions(unittest.TestCase):
    def test_bad_options_are_a_configuration_error_when_decorated(self):
        for options in (
            {"ordinal": -1},
            {"ordinal": "1"},
            {"secret": 5},
            {"max_result_bytes": -1},
        ):
            with self.subTest(**options), self.assertRaises(ConfigurationError):
                idempotent(store="memory:", scope=unique(), **options)(lambda x: x)


if __name__ == "__main__":
    unittest.main()
