"""Pydantic AI: tools that run at most once per intent, in process or behind ``idem mcp``.

Two pieces::

    agent = Agent(model, toolsets=[IdempotentToolset(FunctionToolset([charge_card]))])

    mcp = MCPToolset(transport, process_tool_call=process_tool_call)   # `idem mcp`, key = "runtime"

:class:`IdempotentToolset` wraps any toolset: each call of its tools goes through the same
engine as ``@idempotent`` (one decorated function per tool name), so the model asking again
after a lost result, a retry, or a second agent in the same run gets the stored answer. A
tool's result must be JSON (or pass ``codec=``); a replay is the decoded JSON.

:func:`process_tool_call` is for ``MCPToolset`` in front of ``idem mcp``: it derives the key
and sends it in the request's ``_meta.idempotency_key``, where ``idem mcp`` (with
``key = "runtime"`` in its policy) reads it; the proxy replays.

The scope is ``ctx.run_id``, not ``ctx.tool_call_id``: the tool-call id is new each time the
model asks, so a retry keyed on it acts again (a known way to charge twice). ``run_id`` is the
``run_id=`` passed to ``agent.run`` (pass your own, e.g. the task id, for a run that is
restarted after a crash), else a fresh UUID7 per run; a durable workflow derives it from the
workflow, so a replayed workflow keeps it. ``scope=`` (a value or a function of the
``RunContext``) or an enclosing ``with idem_runtime.scope(...)`` wins over it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Collection, Mapping, Optional, Union

from .._requires import requires

with requires("adapters.pydantic_ai", "pydantic-ai", "pydantic-ai-slim 2.68.0"):
    from pydantic_ai import RunContext
    from pydantic_ai.messages import ToolReturn
    from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
    from pydantic_ai.toolsets.abstract import ToolsetTool

from .._keys import KEY_ARGUMENT, derive_key
from .._scope import Scope
from ..errors import ScopeMissingError
from ._keyed import Fields, KeyedTools, explicit_or_current, idem_metadata, model_arguments

ContextScope = Union[None, str, Scope, Callable[[RunContext[Any]], Union[None, str, Scope]]]


def run_scope(ctx: RunContext[Any], scope: ContextScope = None, *, tool: str = "tool") -> str:
    """The scope of a tool call's key: ``scope=``, else the current ``with
    idem_runtime.scope(...)``, else ``ctx.run_id``; never the tool-call id."""
    found = explicit_or_current(scope, ctx) or (str(ctx.run_id) if ctx.run_id else None)
    if found is None:
        raise ScopeMissingError(
            f"{tool}: no scope for its idempotency key: this RunContext has no run_id (it is "
            f"not from Agent.run). Pass scope=..., or wrap the call in `with "
            f"idem_runtime.scope(run_id):` (never a tool-call id: it changes when the model "
            f"asks again)"
        )
    return found


@dataclasses.dataclass(init=False)
class IdempotentToolset(WrapperToolset[Any]):
    """Wraps ``wrapped`` so its tools run at most once per intent.

    - ``tools``: the names of the tools with side effects (default: all of ``wrapped``'s). A
      read left in would answer a repeated question with its first answer.
    - ``scope``: see the module docstring.
    - ``key_fields``: per tool name, the arguments that make the intent.
    - ``options``: ``@idempotent``'s (``store``, ``retention``, ``lease``, ``wait``,
      ``keep_errors``, ``unknown_errors``, ``on_abandoned``, ``secret``, ``codec``...).

    An exception from the tool releases the key (a ``ModelRetry`` asks the model again, and
    that call runs), unless ``keep_errors`` names it. Every answer is a ``ToolReturn`` whose
    ``metadata`` (kept in the ``ToolReturnPart``, not sent to the model) is ``{"idem":
    {"key": KEY, "replayed": bool}}``. A tool with an ``idempotency_key`` parameter is given
    the derived key there, whatever the model wrote.
    """

    tools: Optional[frozenset]
    scope: ContextScope
    keyed: KeyedTools

    def __init__(
        self,
        wrapped: AbstractToolset[Any],
        *,
        tools: Optional[Collection[str]] = None,
        scope: ContextScope = None,
        key_fields: Optional[Mapping[str, Fields]] = None,
        keyed: Optional[KeyedTools] = None,
        **options: Any,
    ) -> None:
        # dataclasses.replace (for_run, visit_and_replace) passes every field back here.
        self.wrapped = wrapped
        self.tools = frozenset(tools) if tools is not None else None
        self.scope = scope
        self.keyed = keyed if keyed is not None else KeyedTools(options, key_fields)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        if self.tools is not None and name not in self.tools:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        scope_id = run_scope(ctx, self.scope, tool=name)
        forward = tool_args
        if KEY_ARGUMENT in (tool.tool_def.parameters_json_schema.get("properties") or {}):
            forward = {**tool_args, KEY_ARGUMENT: self.keyed.key(scope_id, name, tool_args)}

        async def invoke() -> Any:
            return await self.wrapped.call_tool(name, forward, ctx, tool)

        value, outcome = await self.keyed.call(name, tool_args, scope_id, invoke)
        return _marked(value, outcome)


def _marked(value: Any, outcome: Any) -> Any:
    meta = idem_metadata(outcome)
    if isinstance(value, ToolReturn):
        if value.metadata is None or isinstance(value.metadata, dict):
            return dataclasses.replace(value, metadata={**(value.metadata or {}), **meta})
        return value
    return ToolReturn(return_value=value, metadata=meta)


def keyed_process_tool_call(
    scope: ContextScope = None,
    *,
    secret: Union[None, str, bytes] = None,
    key_fields: Optional[Mapping[str, Fields]] = None,
) -> Callable[..., Any]:
    """A ``process_tool_call`` for ``MCPToolset`` that sends the runtime's key in the MCP
    request's ``_meta.idempotency_key`` (``idem mcp`` with ``key = "runtime"`` reads it
    there): derived from the scope (as :func:`run_scope`), the tool name and the arguments
    less any ``idempotency_key`` the model wrote, so every retry of the intent sends the same
    key. ``secret`` and ``key_fields`` as for ``derive_key``."""
    fields = dict(key_fields or {})

    async def process_tool_call(ctx: RunContext[Any], call_tool: Any, name: str, args: dict[str, Any]) -> Any:
        key = derive_key(
            run_scope(ctx, scope, tool=name),
            name,
            model_arguments(args),
            secret=secret,
            key_fields=fields.get(name),
        )
        return await call_tool(name, args, metadata={KEY_ARGUMENT: key})

    return process_tool_call


process_tool_call = keyed_process_tool_call()
"""``keyed_process_tool_call()`` with its defaults: scope from ``ctx.run_id``."""


__all__ = ["IdempotentToolset", "process_tool_call", "keyed_process_tool_call", "run_scope"]
