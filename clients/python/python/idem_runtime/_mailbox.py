"""Where idem's runtime leaves the answers of an event loop's calls (the decorator's
coroutine path, the ASGI middleware), and the futures they set.

The native ``*_then`` calls run the engine's halves as tasks on idem's runtime. Their
answers go into the loop's native ``Mailbox`` (a queue and a socket pair), whose descriptor
the loop watches with ``add_reader``; the loop then drains it and sets each call's future.
The runtime's threads never take the GIL: a thread state made per answer cost as much as the
hop it saved, and one still being released as the interpreter began to finalize aborted
the process."""

from __future__ import annotations

import asyncio
import itertools
import os
import weakref
from typing import Any, Callable, Dict, Tuple

from . import _native


class Mailbox:
    """One event loop's answers from idem's runtime: the futures of its calls in flight, by
    token, set when the mailbox's descriptor wakes the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pid = os.getpid()
        self.native = _native.Mailbox()
        self.waiting: Dict[int, "asyncio.Future[Any]"] = {}
        self.tokens = itertools.count()
        loop.add_reader(self.native.fileno(), self._drain)

    def expect(self) -> Tuple[int, "asyncio.Future[Any]"]:
        """A token for a native ``*_then`` call, and the future its answer will set."""
        token = next(self.tokens)
        future = self.loop.create_future()
        self.waiting[token] = future
        return token, future

    def _drain(self) -> None:
        for token, ok, value in self.native.drain():
            future = self.waiting.pop(token, None)
            if future is not None and not future.done():
                future.set_result(value) if ok else future.set_exception(value)


_by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox]" = weakref.WeakKeyDictionary()


def mailbox() -> Mailbox:
    """The running loop's mailbox, made on its first call (again in a forked child)."""
    loop = asyncio.get_running_loop()
    box = _by_loop.get(loop)
    if box is None or box.pid != os.getpid():
        box = _by_loop[loop] = Mailbox(loop)
    return box


def later(call: Callable[..., Any], *args: Any) -> "asyncio.Future[Any]":
    """Starts ``call(*args, mailbox, token)``, a native ``*_then`` call, at once, and answers
    the future of what it comes to."""
    box = mailbox()
    token, future = box.expect()
    call(*args, box.native, token)
    return future
