"""The scope of the keys derived in a piece of work: a run, a thread, a task, an order.

A framework's tool-call id changes when the model is asked again, so it is never the scope
on its own (design §7). The scope is set once where the work starts and read wherever a
key is derived below it, through ``contextvars`` (so threads started with
``contextvars.copy_context()``, asyncio tasks and executors' ``run_in_executor`` with a
copied context all see it). It serialises, so a supervisor can hand it to a sub-agent or
a worker process, which then derives the same keys for the same intents.
"""

from __future__ import annotations

import json
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Optional, Union

_FORMAT = "idem-scope/v1"


@dataclass(frozen=True)
class Scope:
    """A scope id. ``child(name)`` makes a sub-scope (a step, a sub-agent's task) whose keys
    differ from the parent's but are as stable."""

    id: str

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            from .errors import ScopeMissingError

            raise ScopeMissingError(f"a scope id must be a non-empty string, not {self.id!r}")

    def child(self, name: str) -> "Scope":
        return Scope(f"{self.id}/{name}")

    def to_dict(self) -> dict:
        return {"format": _FORMAT, "id": self.id}

    def dumps(self) -> str:
        """JSON text to hand to another process (a queue message, an environment variable)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any) -> "Scope":
        """From :meth:`to_dict`'s value, the form both languages write; also the
        ``{"idem_scope": id}`` older Node packages wrote, so a scope handed over by a
        TypeScript agent reads here."""
        if isinstance(data, dict) and set(data) == {"format", "id"} and data["format"] == _FORMAT and isinstance(data["id"], str):
            return cls(data["id"])
        if isinstance(data, dict) and set(data) == {"idem_scope"} and isinstance(data["idem_scope"], str):
            return cls(data["idem_scope"])
        from .errors import ConfigurationError

        raise ConfigurationError(f"not a serialised idem scope ({_FORMAT}): {data!r}")

    @classmethod
    def loads(cls, text: str) -> "Scope":
        return cls.from_dict(json.loads(text))

    def __str__(self) -> str:
        return self.id


_current: ContextVar[Optional[Scope]] = ContextVar("idem_scope", default=None)


def current_scope() -> Optional[Scope]:
    """The scope set by the innermost ``with scope(...)``, or ``None``."""
    return _current.get()


class scope:
    """Sets the scope for the block, in sync and async code alike::

        with scope(run_id) as s:
            charge_card(customer="cus_1", amount_cents=4900)
            worker_queue.put(s.dumps())   # the worker: ``with scope(Scope.loads(text)):``
    """

    def __init__(self, id_or_scope: Union[str, Scope]) -> None:
        self.scope = id_or_scope if isinstance(id_or_scope, Scope) else Scope(id_or_scope)
        self._tokens: list[Token] = []

    def __enter__(self) -> Scope:
        self._tokens.append(_current.set(self.scope))
        return self.scope

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._tokens.pop())

    async def __aenter__(self) -> Scope:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)
