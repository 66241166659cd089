"""Google ADK: a plugin that runs effect tools at most once per intent::

    from idem_runtime.adapters.google_adk import IdempotencyPlugin

    app = App(name="shop", root_agent=agent,
              plugins=[IdempotencyPlugin(tools=["charge_card"], store="sqlite:idem.db")])
    runner = Runner(app=app, session_service=sessions)   # scope: each invocation's id

ADK runs a tool call as: the plugins' and the agent's ``before_tool_callback`` (one that
answers skips the tool), the confirmation gate, ``tool.run_async(args=..., tool_context=...)``,
then the ``after_tool_callback``s. The plugin's ``before_tool_callback`` answers nothing: it arms
this call, and the tool's ``run_async`` (wrapped once per tool object, passing through every
call no ``IdempotencyPlugin`` armed) runs it through the same engine as ``@idempotent`` (one
decorated function per tool), keyed on the scope, the tool's name and the model's arguments
(less any ``idempotency_key`` the model wrote). So a replay skips exactly the tool body:
callbacks, the confirmation gate and the after-tool callbacks run as for any call, and a
callback that answers the call itself (a guard) leaves idem untouched. The model calling the
tool again after an error or a lost answer (ADK's ``ReflectAndRetryToolPlugin`` asks it to),
or a resumed invocation, gets the stored result.

**The scope**, in order: ``scope=`` (a value, or a function of the ``ToolContext``, e.g.
``lambda ctx: ctx.state["order_id"]`` or ``lambda ctx: ctx.session.id``), the current ``with
idem_runtime.scope(...)``, an ``idem_scope`` in the session's state (``state_delta={"idem_scope":
order_id}`` on ``run_async``; ``AgentTool`` copies the state into its sub-agent's session, so
this is how a scope is handed down), else the invocation id: ADK's id for one
``runner.run_async`` (one user message and everything the agents do for it, sub-agents reached
by transfer included; random, ``e-`` and a uuid), kept when a resumable app resumes the
invocation after a crash (``run_async(invocation_id=...)``). Not the session id by default: a
session is a conversation, in which the same charge asked in a later message may be a new
intent (pass ``scope=lambda ctx: ctx.session.id`` where it never is). So a human sending the
same instruction again, in a new message, charges again unless the scope names what they
share (the order). Never the function call's id: it is new each time the model asks.

**Results.** A result is stored (as JSON: pydantic values, ADK's media parts included, as
their JSON form) and replayed; the function-response event of a call idem answered carries
``custom_metadata={"idem": {"key": ..., "replayed": ...}}`` (``idem inspect KEY`` shows the
record). A result with an ``error`` key (how ``FunctionTool`` reports bad arguments, a
confirmation still to give or refused, and ADK's convention for a tool's failure) is given as
it was and releases the key; the tool's exception releases it too, unless ``keep_errors=`` or
``unknown_errors=`` list it, and reaches ADK as before. What a tool does to its
``ToolContext`` (state, actions such as ``transfer_to_agent`` or ``escalate``) is not replayed:
name only tools whose effect is their result. ``AgentTool``s (their own tools are the effects)
are never keyed, nor are streaming tools (async generators) in live runs, which ADK runs
without ``run_async``.

**Errors.** ADK fails the run on a tool's exception unless a plugin or callback answers it
(``on_tool_error_callback``; ``ReflectAndRetryToolPlugin`` turns it into text for the model).
idem *not configured* (no scope; arguments no key can be derived from; an option idem refuses)
is raised, so the run fails, and also logged at ERROR on the ``idem_runtime`` logger, so that
a plugin that turns it into text for the model does not hide it. The others reach the model
as a result ``{"error": ...}`` saying what it may do: *store unavailable* (nothing ran, try
again later; also logged at ERROR), *in flight* ("do not call it again yet"), *unknown
outcome* (an operator must resolve the key) and *key reused*.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Union

from .._requires import requires

with requires("adapters.google_adk", "google-adk", "google-adk 2.13.0"):
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.tools.agent_tool import AgentTool
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext

from .. import errors
from .._scope import Scope
from ._keyed import Fields, KeyedTools, as_json, explicit_or_current, first_scope, idem_metadata, refusal

ContextScope = Union[None, str, Scope, Callable[[ToolContext], Union[None, str, Scope]]]

#: The session state key a caller may put the scope under.
STATE_SCOPE = "idem_scope"
#: idem's refusals that mean "not configured": raised, so the run fails.
_NOT_CONFIGURED = (errors.ScopeMissingError, errors.ConfigurationError, errors.KeyDerivationError)

#: The calls a plugin armed (its before_tool_callback), by their ToolContext: the wrapped
#: run_async of the tool keys only these.
_armed: "weakref.WeakKeyDictionary[Any, IdempotencyPlugin]" = weakref.WeakKeyDictionary()


class IdempotencyPlugin(BasePlugin):
    """Runs the named tools (``tools=``; every tool when ``None``, which also replays reads:
    name the effects) at most once per (scope, tool, arguments). ``key_fields={tool: [...]}``;
    other options are ``@idempotent``'s (``store``, ``retention``, ``wait``, ...)."""

    def __init__(
        self,
        tools: Optional[Iterable[str]] = None,
        *,
        scope: ContextScope = None,
        key_fields: Optional[Mapping[str, Fields]] = None,
        name: str = "idem",
        **options: Any,
    ) -> None:
        if isinstance(tools, str):
            raise errors.ConfigurationError(f"tools is a list of tool names, such as [{tools!r}], not one string")
        super().__init__(name=name)
        self.tools = None if tools is None else frozenset(tools)
        self.scope = scope
        self.keyed = KeyedTools(options, key_fields)
        # The idem metadata of the calls answered, by function call id, until their event.
        self._answered: Dict[str, Dict[str, Any]] = {}

    async def before_tool_callback(self, *, tool: BaseTool, tool_args: Dict[str, Any], tool_context: ToolContext) -> None:
        if isinstance(tool, AgentTool) or getattr(tool, "_defers_response", False):
            return None
        if self.tools is not None and tool.name not in self.tools:
            return None
        _wrap(tool)
        _armed[tool_context] = self
        return None

    async def on_event_callback(self, *, invocation_context: Any, event: Any) -> None:
        """Marks a function-response event of a call idem answered (``custom_metadata``)."""
        for response in event.get_function_responses() if self._answered else ():
            marked = self._answered.pop(response.id, None) if response.id else None
            if marked is not None:
                event.custom_metadata = {**(event.custom_metadata or {}), **marked}
        return None

    def run_scope(self, name: str, tool_context: ToolContext) -> str:
        """The scope of a call's key, as the module docstring says; never the call's id."""
        found = explicit_or_current(self.scope, tool_context) or first_scope(
            lambda: tool_context.state.get(STATE_SCOPE), lambda: tool_context.invocation_id
        )
        if found is None:
            raise errors.ScopeMissingError(
                f"{name}: no scope for its idempotency key, so it was not run: the invocation has no "
                f"id. Pass scope=... to IdempotencyPlugin, state_delta={{'{STATE_SCOPE}': order_id}} "
                f"to run_async, or run inside `with idem_runtime.scope(run_id):`"
            )
        return found

    async def run(self, tool: BaseTool, run_async: Callable[..., Any], args: Dict[str, Any], tool_context: ToolContext) -> Any:
        """One armed call of ``tool`` (its own ``run_async``) through the engine."""
        name = tool.name
        call = _Call()

        async def invoke() -> Any:
            call.ran = True
            call.result = await run_async(args=args, tool_context=tool_context)
            if isinstance(call.result, dict) and "error" in call.result:
                raise _NotStored()
            return as_json(call.result)

        try:
            stored, outcome = await self.keyed.call(name, args, self.run_scope(name, tool_context), invoke)
        except Exception as e:
            if isinstance(e, _NotStored) or call.ran or not isinstance(e, errors.IdemError):
                if isinstance(e, _NotStored):
                    return call.result
                raise
            said = None if isinstance(e, errors.ReplayedError) else refusal(name, e)
            if said is None or isinstance(e, _NOT_CONFIGURED):
                raise  # a kept error replayed, as the tool's own; or not configured: the run fails
            return {"error": said[0]}
        if tool_context.function_call_id:
            self._answered[tool_context.function_call_id] = idem_metadata(outcome)
        return stored if outcome.replayed else call.result


class _NotStored(Exception):
    """The tool answered an error result: released, given as it was."""


class _Call:
    def __init__(self) -> None:
        self.ran = False
        self.result: Any = None


def _wrap(tool: BaseTool) -> None:
    """Wraps ``tool.run_async`` (on this object only) so that a call a plugin armed runs
    through it; every other call runs the tool as before."""
    if getattr(tool.run_async, "_idem_wrapped", False):
        return
    own = tool.run_async

    async def run_async(*, args: Dict[str, Any], tool_context: ToolContext) -> Any:
        plugin = _armed.pop(tool_context, None)
        if plugin is None:
            return await own(args=args, tool_context=tool_context)
        return await plugin.run(tool, own, args, tool_context)

    run_async._idem_wrapped = True  # type: ignore[attr-defined]
    tool.run_async = run_async  # type: ignore[method-assign]
