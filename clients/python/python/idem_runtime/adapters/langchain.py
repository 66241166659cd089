"""LangChain v1 agents and LangGraph's ``ToolNode``: the named tools run at most once per intent.

One class, :class:`IdempotencyMiddleware`, serves both, because LangChain's agent middleware
hook and ``ToolNode``'s interceptor have the same shape, ``(request, handler) -> ToolMessage``::

    idem = IdempotencyMiddleware(tools=["charge_card"], store="sqlite:idem.db")
    agent = create_agent(model, tools, middleware=[ToolRetryMiddleware(), idem],
                         checkpointer=InMemorySaver())
    # or, in a graph of your own:
    ToolNode(tools, wrap_tool_call=idem.wrap_tool_call, awrap_tool_call=idem.awrap_tool_call)

Each named tool gets one ``@idempotent`` function (``_keyed.KeyedTools``, as in the other
adapters: the decorator's engine, claim and completion; nothing here decides what runs). Its
key is derived from the scope, the tool's name and the tool call's arguments, so a call
repeated by a retry middleware, by the model asking again after a lost result, or by the
graph resuming from its checkpoint in another process gets the stored ``ToolMessage`` back
instead of acting twice. The tool runs inside ``with idem_runtime.scope(<its scope>)``.

The scope is the LangGraph **thread id**: the one id that survives all three of those (a
tool-call id is new each time the model asks, and a run id is new on every ``invoke``, so a
resume after a crash would act again under either). Put retries and resumes for one piece of
work in one thread. Within a thread, the same tool with the same arguments is one intent for
the retention period; if a conversation may deliberately repeat a call, pass ``scope=`` a
function of the request (a per-turn id, an order id) or key on fields that differ.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from .._requires import requires

with requires("adapters.langchain", "langchain", "langchain 1.5.2 and langgraph 1.2.24"):
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.messages import ToolMessage

from .._keys import KEY_ARGUMENT
from .._scope import Scope, current_scope
from ..errors import ConfigurationError, ScopeMissingError
from ._keyed import KeyedTools, explicit_scope, first_scope, idem_metadata, model_arguments

log = logging.getLogger("idem_runtime")

RequestScope = Union[None, str, Scope, Callable[[Any], Union[str, Scope, None]]]


class _NotStored(Exception):
    """The tool's answer is not a result to replay; this call still answers with it."""

    def __init__(self, why: str, answer: Any) -> None:
        super().__init__(why)
        self.answer = answer


class _ErrorMessage(_NotStored):
    """The tool failed and the tool node turned the error into a message: nothing is stored,
    the key is released (design §4), so a retry runs the tool."""


class _Unstorable(_NotStored):
    """The tool ran but answered with something other than a ``ToolMessage`` (a ``Command``),
    which cannot be replayed: its outcome is recorded as unknown, so a retry asks an operator
    (``OutcomeUnknownError``) instead of acting twice."""


def _payload(result: Any) -> dict:
    if isinstance(result, ToolMessage):
        if result.status == "error":
            raise _ErrorMessage(str(result.content), result)
        payload = {"content": result.content, "status": result.status}
        if result.artifact is not None:
            payload["artifact"] = result.artifact
        return payload
    raise _Unstorable(f"a {type(result).__name__} result cannot be stored for replay", result)


def _config_get(config: Any, *path: str) -> Any:
    for name in path:
        if not isinstance(config, Mapping):
            return None
        config = config.get(name)
    return config


def thread_scope(request: Any) -> Optional[str]:
    """The scope LangGraph offers a tool call: the thread id, else a ``run_id`` the caller
    put in the run's config (LangGraph sets none of its own), else ``None``."""
    runtime = getattr(request, "runtime", None)
    info = getattr(runtime, "execution_info", None)
    config = getattr(runtime, "config", None)
    for value in (
        getattr(info, "thread_id", None),
        _config_get(config, "configurable", "thread_id"),
        getattr(info, "run_id", None),
        _config_get(config, "run_id"),
    ):
        if value is not None and str(value):
            return str(value)
    return None


class IdempotencyMiddleware(AgentMiddleware):
    """Makes the named tools at-most-once per intent in a LangChain agent or a ``ToolNode``.

    - ``tools``: the tools with side effects, by name or as ``BaseTool``s. Other tools run as
      they would without it (a read must not replay a stale answer).
    - ``store``: a store URL or ``Store`` (default ``$IDEM_STORE``, else ``sqlite:idem.db``).
    - ``key_fields``: per tool name, the arguments that make the intent (names, dotted paths
      or JSON Pointers); default all of the tool call's arguments.
    - ``scope``: a string or ``Scope``, or a function of the ``ToolCallRequest`` returning
      one; default the thread id (see the module docstring), then a ``run_id`` in the
      config, then the current ``with idem_runtime.scope(...)``.
    - ``options``: passed to ``@idempotent`` (``retention``, ``lease``, ``wait``,
      ``keep_errors``, ``unknown_errors``, ``on_abandoned``, ``secret``, ...).

    A tool that takes an ``idempotency_key`` argument gets the key in it (whatever the model
    wrote there), to hand on to the API it calls. Every answer's ``response_metadata`` has
    ``{"idem": {"replayed": bool, "key": KEY}}``; a replay is a new ``ToolMessage`` for the
    current tool call id, with the first call's content, status and artifact. A tool's
    artifact must be JSON (or pass ``codec=``).
    """

    def __init__(
        self,
        *,
        tools: Iterable[Any],
        store: Any = None,
        key_fields: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
        scope: RequestScope = None,
        **options: Any,
    ) -> None:
        super().__init__()
        names = [t if isinstance(t, str) else getattr(t, "name", None) for t in tools]
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigurationError(
                "IdempotencyMiddleware(tools=[...]) needs the names (or BaseTools) of the tools "
                "with side effects; a read-only tool should not replay old answers"
            )
        self.tool_names = frozenset(names)
        key_fields = dict(key_fields or {})
        stray = set(key_fields) - self.tool_names
        if stray:
            raise ConfigurationError(f"key_fields names tools not in tools=: {sorted(stray)}")
        unknown = tuple(options.pop("unknown_errors", ())) + (_Unstorable,)
        self.scope = scope
        self.tools = []  # adds no tools to the agent
        self.keyed = KeyedTools({**options, "store": store, "unknown_errors": unknown}, key_fields)
        self._takes_key: Dict[str, bool] = {}

    # -- what both hooks share -------------------------------------------------------------

    def scope_for(self, request: Any) -> str:
        """The scope of ``request``'s key; raises ``ScopeMissingError`` if there is none."""
        found = first_scope(
            lambda: explicit_scope(self.scope, request), lambda: thread_scope(request), current_scope
        )
        if found is None:
            name = request.tool_call.get("name")
            raise ScopeMissingError(
                f"{name}: no scope for its idempotency key. Run the agent with a checkpointer "
                f"and config={{'configurable': {{'thread_id': ...}}}}, pass scope=... to "
                f"IdempotencyMiddleware, or wrap the run in `with idem_runtime.scope(run_id):` "
                f"(never a tool-call id: it changes when the model asks again)"
            )
        return found

    def _takes_key_arg(self, tool: Any) -> bool:
        name = tool.name
        if name not in self._takes_key:
            try:
                fields = tool.get_input_schema().model_fields
            except Exception:
                fields = getattr(tool, "args", None) or {}
            self._takes_key[name] = KEY_ARGUMENT in fields
        return self._takes_key[name]

    def _prepare(self, request: Any) -> Optional[Tuple[Any, str, Tuple[str, dict, str]]]:
        """The request to execute, the key, and the tool call as ``KeyedTools`` takes it
        (name, arguments, scope); ``None`` for a tool this middleware leaves alone."""
        call = request.tool_call
        name = call.get("name")
        if name not in self.tool_names or getattr(request, "tool", None) is None:
            return None
        args = model_arguments(call.get("args") or {})
        scope_id = self.scope_for(request)
        key = self.keyed.key(scope_id, name, args)
        if self._takes_key_arg(request.tool):
            request = request.override(tool_call={**call, "args": {**args, KEY_ARGUMENT: key}})
        return request, key, (name, args, scope_id)

    @staticmethod
    def _finish(request: Any, key: str, answered: list, done: Any) -> Any:
        """This call's answer: the tool's message marked executed, a replay, or an answer that
        was not stored."""
        if isinstance(done, _Unstorable):
            log.warning("idem: %s ran for %s but %s; a repeat raises OutcomeUnknownError",
                        request.tool_call.get("name"), key, done)
        if isinstance(done, _NotStored):
            return done.answer
        value, outcome = done
        if not outcome.replayed:
            meta = {**(answered[-1].response_metadata or {}), **idem_metadata(outcome)}
            return answered[-1].model_copy(update={"response_metadata": meta})
        call = request.tool_call
        return ToolMessage(
            content=value.get("content", ""),
            status=value.get("status", "success"),
            artifact=value.get("artifact"),
            name=call.get("name"),
            tool_call_id=call.get("id"),
            response_metadata=idem_metadata(outcome),
        )

    # -- the hooks ---------------------------------------------------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        prepared = self._prepare(request)
        if prepared is None:
            return handler(request)
        request, key, call = prepared
        answered: list = []

        def execute() -> dict:
            answered.append(handler(request))
            return _payload(answered[-1])

        try:
            done = self.keyed.call_sync(*call, execute)
        except _NotStored as e:
            done = e
        return self._finish(request, key, answered, done)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        prepared = self._prepare(request)
        if prepared is None:
            return await handler(request)
        request, key, call = prepared
        answered: list = []

        async def execute() -> dict:
            answered.append(await handler(request))
            return _payload(answered[-1])

        try:
            done = await self.keyed.call(*call, execute)
        except _NotStored as e:
            done = e
        return self._finish(request, key, answered, done)


__all__ = ["IdempotencyMiddleware", "thread_scope"]
