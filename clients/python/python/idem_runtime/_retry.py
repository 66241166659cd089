"""How a call is retried: the Rust ``ToolClient``'s policy (crates/idem-client, design §7
"Retry with the same key on every path"), in one place for the HTTP transport and the MCP
helper, sync and async alike.

Exponential backoff with full jitter, bounded in attempts and in time; a server's
``Retry-After`` is a floor under the jittered wait. The loops that use it only say what an
attempt came to; :class:`Budget` says whether, and after how long, another one starts.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts in all (the first included), the backoff bound before the second attempt
    (doubling each time, never past ``cap``), and how long after the first attempt a new
    one may still start. Times are in seconds. The defaults are the Rust client's."""

    max_attempts: int = 5
    base: float = 0.1
    cap: float = 10.0
    max_total: float = 60.0

    def __post_init__(self) -> None:
        from .errors import ConfigurationError

        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be an integer of at least 1, not {self.max_attempts!r}")
        for name in ("base", "cap", "max_total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigurationError(f"{name} must be a number of seconds, not {value!r}")

    def backoff_bound(self, failed: int) -> float:
        """The upper bound of the wait after ``failed`` attempts (1 after the first)."""
        # 2**(failed-1) overflows float for huge counts; the cap decides long before.
        exponent = min(max(failed - 1, 0), 64)
        return min(self.base * (2**exponent), self.cap)

    def delay(self, failed: int, retry_after: Optional[float] = None, rand: Callable[[], float] = random.random) -> float:
        """Uniform in [0, bound] ("full jitter"), but never less than ``retry_after``."""
        jitter = self.backoff_bound(failed) * rand()
        return jitter if retry_after is None else max(retry_after, jitter)


DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True)
class Attempt:
    """One attempt, as reported to an ``on_attempt`` observer (metrics, logs, tests).

    ``status`` is the HTTP status of an answer (for MCP: 200 for a result), ``error`` the
    failure when no answer came; ``retry_in`` the wait before the next attempt, ``None``
    when this one was the last."""

    tool: Optional[str]
    key: Optional[str]
    number: int
    status: Optional[int] = None
    error: Optional[BaseException] = None
    problem: Optional[str] = None
    retry_in: Optional[float] = None


class Budget:
    """The attempts and time one call may still spend."""

    def __init__(self, policy: RetryPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self.start = clock()

    def next_delay(self, number: int, retry_after: Optional[float]) -> Optional[float]:
        """The wait before attempt ``number + 1``, or ``None`` when the attempts or the time
        are spent (no attempt starts later than ``max_total`` after the first)."""
        delay = self.policy.delay(number, retry_after)
        if number >= self.policy.max_attempts:
            return None
        if self.clock() - self.start + delay > self.policy.max_total:
            return None
        return delay


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` in seconds, capped at a day; an HTTP date (rare from APIs) counts as
    absent, as in the Rust client (the retry policy's total bound decides anyway)."""
    if value is None:
        return None
    value = value.strip()
    if not value.isdigit():
        return None
    return float(min(int(value), 86_400))


def observe(on_attempt: Optional[Callable[[Attempt], Any]], attempt: Attempt) -> None:
    if on_attempt is not None:
        on_attempt(attempt)
