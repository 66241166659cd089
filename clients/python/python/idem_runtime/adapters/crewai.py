"""CrewAI: tools that run at most once per intent::

    from idem_runtime.adapters.crewai import idempotent_tool

    charge = idempotent_tool(charge_card, store="sqlite:idem.db")  # a CrewAI tool: @tool's or a BaseTool
    agent = Agent(role="billing", goal=..., backstory=..., tools=[charge, lookup])
    Crew(agents=[agent], tasks=[task]).kickoff()                    # scope: this kickoff's execution id

Each call goes through the same engine as ``@idempotent`` (one decorated function per tool),
keyed on the scope, the tool's name and the model's arguments (less any ``idempotency_key``
the model wrote). The agent calling the tool again after an error or a timeout it was told
about, or another agent of the crew asking the same, gets the stored result.

**The scope**, in order: ``scope=`` (a value, or a function of the tool's arguments, e.g.
``lambda args: args["order_id"]``), the current ``with idem_runtime.scope(...)``, else CrewAI's
execution id (``crewai.execution.get_execution_uuid()``): one per outermost ``kickoff`` of a
crew or flow, inherited by nested kickoffs and the tools they call. A new kickoff is a new
run with new keys, so a crew re-run after a crash, or a human sending the same instruction
again, charges again unless the scope names what they share: the job, set by the host with
``crewai.execution.set_execution_uuid(job_id)`` before the kickoff, or the order, with
``scope=``. Never an id of the tool call or of a task object: they are new each time.

**Errors CrewAI would swallow.** CrewAI turns a tool's exception into text for the model (the
run goes on, and the crew may report success for a charge that never ran). So idem's own
answers come back as a CrewAI ``ToolFailure``, which the model reads as text and CrewAI records
as a failed call (a ``ToolFailureDetectedEvent``; under ``tool_failure_policy=
ToolFailurePolicy.RAISE`` on the tool, agent, task or crew, the run stops):

- *not configured* (no scope, arguments no key can be derived from, an option idem refuses):
  nothing ran; also logged at ERROR on the ``idem_runtime`` logger, since no model can fix it;
- *store unavailable* (a URL that does not open, a store that is down): nothing ran, "try
  again later"; also logged at ERROR;
- *in flight* ("another call with this key is running: do not call it again yet"), *unknown
  outcome* (an earlier call may have acted; an operator must resolve the key) and *key reused*
  (these arguments were used with another intent's key): nothing ran, and the text says what
  the model may do.

The tool's own exceptions are the tool's (an idem refusal of an ``@idempotent`` call inside
it included): CrewAI reports them as before, and the key is released (a retry runs again)
unless ``keep_errors=`` or ``unknown_errors=`` list them. A ``ToolFailure`` the tool returns
is given as it was and releases the key too; a coroutine a plain function returns is run, as
CrewAI's ``Tool.run`` does.

Two limits. A crew restored with ``Crew.from_checkpoint`` rebuilds its tools from their
classes, without idem: wrap them again before resuming. And ``Flow.chat()`` with tracing on
keeps one execution id for every turn of the conversation, so a turn asking the same charge
again replays it there: pass a per-turn or business ``scope=`` where that is a new intent.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Mapping, Union

from .._requires import requires

with requires("adapters.crewai", "crewai", "crewai 1.15.30"):
    from crewai.execution import get_execution_uuid
    from crewai.tools import BaseTool
    from crewai.tools.base_tool import Tool
    from crewai.tools.tool_failure import ToolFailure, ToolFailureReason

from .._scope import Scope
from .. import errors
from ._keyed import Fields, KeyedTools, explicit_or_current, first_scope, refusal

ArgsScope = Union[None, str, Scope, Callable[[Mapping[str, Any]], Union[None, str, Scope]]]


def run_scope(name: str, args: Mapping[str, Any], scope: ArgsScope = None) -> str:
    """The scope of a call's key, as the module docstring says."""
    found = explicit_or_current(scope, args) or first_scope(get_execution_uuid)
    if found is None:
        raise errors.ScopeMissingError(
            f"{name}: no scope for its idempotency key, so it was not run: it was called outside "
            f"a crew or flow kickoff. Pass scope=... to idempotent_tool (a job or order id, kept "
            f"across restarts), or call it inside `with idem_runtime.scope(run_id):`"
        )
    return found


def idempotent_tool(
    tool: BaseTool,
    *,
    scope: ArgsScope = None,
    key_fields: Fields = None,
    **options: Any,
) -> BaseTool:
    """A copy of ``tool`` (a CrewAI ``BaseTool``: the ``@tool`` decorator's, or a subclass)
    whose calls run at most once per (scope, tool, arguments). ``options`` are
    ``@idempotent``'s (``store``, ``retention``, ``wait``, ``keep_errors``, ...)."""
    if not isinstance(tool, BaseTool):
        raise errors.ConfigurationError(
            f"idempotent_tool takes a CrewAI tool (crewai.tools.BaseTool, as @tool makes), not {tool!r}"
        )
    keyed = KeyedTools(options, {tool.name: key_fields})
    name = tool.name

    def sync(invoke: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            call = _Call()

            def body() -> Any:
                call.ran = True
                result = invoke(**kwargs)
                if inspect.isawaitable(result):
                    # A plain function that returns a coroutine: run it, as CrewAI's Tool.run does.
                    result = asyncio.run(_awaited(result))
                return call.kept(result)

            try:
                positional(name, args)
                return keyed.call_sync(name, kwargs, run_scope(name, kwargs, scope), body)[0]
            except Exception as e:
                return call.answer(name, e)

        return run

    def asynchronous(invoke: Callable[..., Any]) -> Callable[..., Any]:
        async def run(*args: Any, **kwargs: Any) -> Any:
            call = _Call()

            async def body() -> Any:
                call.ran = True
                result = invoke(**kwargs)
                if inspect.isawaitable(result):
                    result = await result
                return call.kept(result)

            try:
                positional(name, args)
                return (await keyed.call(name, kwargs, run_scope(name, kwargs, scope), body))[0]
            except Exception as e:
                return call.answer(name, e)

        return run

    if isinstance(tool, Tool):
        # @tool's: run(), _run() and _arun() all call `func`.
        func = tool.func
        return tool.model_copy(update={"func": asynchronous(func) if inspect.iscoroutinefunction(func) else sync(func)})
    # A subclass: its own _run (and _arun, where it has one). Instance attributes, so the class
    # and every other instance of it are untouched.
    copy = tool.model_copy()
    object.__setattr__(copy, "_run", sync(tool._run))
    object.__setattr__(copy, "_arun", asynchronous(tool._arun))
    return copy


class _NotStored(Exception):
    """The tool reported a failure (returned a ToolFailure): released, so a retry runs it again."""


class _Call:
    """One call: whether the engine ran the tool, and a ToolFailure it returned."""

    def __init__(self) -> None:
        self.ran = False
        self.reported: Any = None

    def kept(self, result: Any) -> Any:
        """The tool's result for the engine to store; a ToolFailure is not one."""
        if isinstance(result, ToolFailure):
            self.reported = result
            raise _NotStored()
        return result

    def answer(self, name: str, e: Exception) -> Any:
        """What CrewAI gets when the engine raised: the tool's own ToolFailure or exception as
        they were (an idem refusal from an ``@idempotent`` call inside the tool included),
        or, where the tool did not run, idem's refusal (``failure``)."""
        if isinstance(e, _NotStored):
            return self.reported
        if self.ran or not isinstance(e, errors.IdemError):
            raise e
        return failure(name, e)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def positional(name: str, args: tuple) -> None:
    """CrewAI calls tools with keyword arguments; a positional one could not be keyed by name."""
    if args:
        raise errors.ConfigurationError(
            f"{name}: idempotent_tool keys a call on its keyword arguments (as CrewAI passes "
            f"them); this call passed {len(args)} positional"
        )


def failure(name: str, e: errors.IdemError) -> Any:
    """idem's answer as a CrewAI ToolFailure (see the module docstring); a kept error of the
    first call, replayed, is raised as the tool's own."""
    said = None if isinstance(e, errors.ReplayedError) else refusal(name, e)
    if said is None:
        raise e
    message, retryable = said
    return ToolFailure(message=message, reason=ToolFailureReason.TOOL_REPORTED, code=type(e).__name__, retryable=retryable)
