"""Adversarial: a call that ran must always settle its key. A codec whose ``encode`` does not
return bytes, or a kept exception whose ``__str__`` raises, left the ticket unfinished: the
key read as in flight (for as long as the traceback kept the ticket alive, its heartbeat
went on) instead of settling. A generator function never runs its body when called, so it
is refused when decorated instead of leaving an unknown outcome."""

from __future__ import annotations

import unittest
import uuid

from idem_runtime import (
    ConfigurationError,
    InFlightError,
    OutcomeUnknownError,
    idempotent,
)


def unique() -> str:
    return "t" + uuid.uuid4().hex[:12]


class TextCodec:
    media_type = "text/plain"

    def encode(self, value):
        return str(value)  # text, not bytes

    def decode(self, data):
        return data.decode()


class UnprintableDecline(Exception):
    def __str__(self):
        raise RuntimeError("no text for this one")


class Settling(unittest.TestCase):
    def test_a_codec_returning_text_settles_the_key_as_unknown(self):
        ran = []

        @idempotent(store="memory:", scope=unique(), codec=TextCodec(), wait=0)
        def f(x):
            ran.append(x)
            return x

        with self.assertRaises(ConfigurationError):
            f(1)
        try:
            f(1)
        except InFlightError:
            self.fail("the key was left in flight after the call ended")
        except OutcomeUnknownError:
            pass
        self.assertEqual(ran, [1])

    def test_a_kept_error_whose_str_raises_is_still_kept(self):
        ran = []

        @idempotent(store="memory:", scope=unique(), keep_errors=[UnprintableDecline], wait=0)
        def g(x):
            ran.append(x)
            raise UnprintableDecline()

        with self.assertRaises(UnprintableDecline):
            g(1)
        try:
            g(1)
        except InFlightError:
            self.fail("the key was left in flight after the call ended")
        except UnprintableDecline:
            pass
        self.assertEqual(ran, [1])

    def test_a_generator_function_is_refused_when_decorated(self):
        with self.assertRaises(ConfigurationError):

            @idempotent(store="memory:", scope=unique())
            def gen(x):
                yield x

        with self.assertRaises(ConfigurationError):

            @idempotent(store="memory:", scope=unique())
            async def agen(x):
                yield x

    def test_a_codec_whose_media_type_is_not_text_is_refused_when_decorated(self):
        class Odd(TextCodec):
            media_type = 7

        with self.assertRaises(ConfigurationError):

            @idempotent(store="memory:", scope=unique(), codec=Odd())
            def f(x):
                return x


if __name__ == "__main__":
    unittest.main()
