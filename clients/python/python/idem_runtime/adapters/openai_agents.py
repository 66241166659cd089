"""The OpenAI Agents SDK: function tools that run at most once per intent::

    @idempotent_function_tool(store="sqlite:idem.db")
    async def charge_card(customer: str, amount_cents: int) -> dict:
        return await payments.charge(customer, amount_cents)

    agent = Agent(name="billing", tools=[charge_card])       # or idempotent_tool(existing_tool)

Each call goes through the same engine as ``@idempotent`` (one decorated function per tool),
keyed on the scope, the tool's name and the model's arguments (less any ``idempotency_key``
the model wrote). The model calling the tool again after an error or a timeout it was told
about, a second agent in the same run, or a resumed ``RunState`` gets the stored result.

The SDK has no run id of its own; the scope is, in order: ``scope=`` (a value, or a function
of the ``ToolContext``: e.g. ``lambda ctx: ctx.context.order_id``), the current ``with
idem_runtime.scope(...)``, ``RunConfig(trace_id=...)``, else the id of the run's trace (new on
every ``Runner.run``, kept by a ``RunState`` resumed after an approval, and shared with
agents-as-tools inside the run). Never ``ctx.tool_call_id``: it is new each time the model
asks, so a retry keyed on it acts again. ``RunConfig.group_id`` names a whole conversation,
whose later turns may mean the same call again; use it only through ``scope=``. With tracing
disabled and none of these, the tool does not run and the model is told why.
"""

from __future__ import annotations

import copy
import inspect
import json
from typing import Any, Callable, Optional, Union

from .._requires import requires

with requires("adapters.openai_agents", "openai-agents", "openai-agents 0.24.0"):
    from agents import FunctionTool, function_tool, get_current_trace
    from agents.tool import (
        FunctionToolCustomDataContext,
        maybe_invoke_function_tool_failure_error_function,
        set_function_tool_failure_error_function,
    )
    from agents.tool_context import ToolContext

from .._scope import Scope
from ..errors import ScopeMissingError
from ._keyed import Fields, KeyedTools, explicit_or_current, first_scope

ContextScope = Union[None, str, Scope, Callable[[ToolContext[Any]], Union[None, str, Scope]]]

_OUTCOME = "_idem_runtime_outcome"
_NO_TRACE = "no-op"


def _trace_id() -> Optional[str]:
    trace = get_current_trace()
    trace_id = getattr(trace, "trace_id", None)
    return trace_id if trace_id and trace_id != _NO_TRACE else None


def run_scope(ctx: ToolContext[Any], scope: ContextScope = None) -> str:
    """The scope of a tool call's key, as the module docstring says; never the tool-call id."""
    run_config = getattr(ctx, "run_config", None)
    found = explicit_or_current(scope, ctx) or first_scope(
        lambda: getattr(run_config, "trace_id", None), _trace_id
    )
    if found is None:
        raise ScopeMissingError(
            f"{ctx.tool_name}: no scope for its idempotency key, so it was not run: tracing is "
            f"disabled, so this run has no id. Pass RunConfig(trace_id=...) (a task id, kept "
            f"across restarts), pass scope=... to the tool, or wrap Runner.run in `with "
            f"idem_runtime.scope(run_id):` (never a tool-call id: it changes when the model asks "
            f"again)"
        )
    return found


def idempotent_tool(
    tool: FunctionTool,
    *,
    scope: ContextScope = None,
    key_fields: Fields = None,
    **options: Any,
) -> FunctionTool:
    """A copy of ``tool`` that runs at most once per intent. ``options`` are
    ``@idempotent``'s (``store``, ``retention``, ``keep_errors``, ``unknown_errors``, ...).

    The tool's own exceptions reach the engine before the SDK turns them into a message for
    the model (its ``failure_error_function``, applied after), so an error releases the key
    and the model's retry runs the tool (design §4), unless ``keep_errors`` names it. A
    cancellation (the tool's ``timeout``) leaves the outcome unknown: the next call tells the
    model so, and ``idem resolve`` settles it. The output item's ``custom_data`` (not sent to
    the model) is ``{"idem": {"key": KEY, "replayed": bool}}``.
    """
    keyed = KeyedTools(options, {tool.name: key_fields} if key_fields is not None else None)
    inner = copy.copy(tool)
    set_function_tool_failure_error_function(inner, None)  # its errors reach the engine as raised
    outer = copy.copy(tool)
    user_extractor = tool.custom_data_extractor

    async def on_invoke_tool(ctx: ToolContext[Any], input: str) -> Any:
        try:
            args = json.loads(input) if input else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            # Not a JSON object: the SDK rejects it before the function could run.
            return await tool.on_invoke_tool(ctx, input)
        try:
            value, _ = await keyed.call(
                tool.name,
                args,
                run_scope(ctx, scope),
                lambda: inner.on_invoke_tool(ctx, input),
                mark=lambda meta: setattr(ctx, _OUTCOME, meta),
            )
        except Exception as e:
            message = await maybe_invoke_function_tool_failure_error_function(
                function_tool=outer, context=ctx, error=e
            )
            if message is None:
                raise
            return message
        return value

    async def custom_data(data: FunctionToolCustomDataContext) -> Optional[dict]:
        own = None
        if user_extractor is not None:
            own = user_extractor(data)
            if inspect.isawaitable(own):
                own = await own
        mark = getattr(data.tool_context, _OUTCOME, None)
        if mark is None:
            return own
        return {**(own or {}), **mark}

    outer.on_invoke_tool = on_invoke_tool
    outer.custom_data_extractor = custom_data
    return outer


def idempotent_function_tool(
    func: Optional[Callable[..., Any]] = None,
    *,
    scope: ContextScope = None,
    key_fields: Fields = None,
    store: Any = None,
    retention: Any = None,
    lease: Any = None,
    wait: Any = None,
    on_abandoned: Optional[str] = None,
    keep_errors: Any = None,
    unknown_errors: Any = None,
    codec: Any = None,
    secret: Union[None, str, bytes] = None,
    ordinal: Optional[int] = None,
    max_result_bytes: Optional[int] = None,
    **function_tool_options: Any,
) -> Any:
    """``@function_tool`` (with its options: ``name_override``, ``timeout``,
    ``failure_error_function``, ...) made idempotent by :func:`idempotent_tool`; bare or
    with arguments, like ``function_tool``."""
    given = dict(
        store=store, retention=retention, lease=lease, wait=wait, on_abandoned=on_abandoned,
        keep_errors=keep_errors, unknown_errors=unknown_errors, codec=codec, secret=secret,
        ordinal=ordinal, max_result_bytes=max_result_bytes,
    )
    idem_options = {k: v for k, v in given.items() if v is not None}

    def make(f: Callable[..., Any]) -> FunctionTool:
        return idempotent_tool(
            function_tool(f, **function_tool_options), scope=scope, key_fields=key_fields, **idem_options
        )

    return make(func) if func is not None else make


__all__ = ["idempotent_function_tool", "idempotent_tool", "run_scope"]
