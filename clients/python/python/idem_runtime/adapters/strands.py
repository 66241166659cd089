"""Strands Agents: a hook provider that runs effect tools at most once per intent::

    from idem_runtime.adapters.strands import IdempotencyHooks

    agent = Agent(model=model, tools=[charge_card, lookup],
                  hooks=[IdempotencyHooks(tools=["charge_card"], store="sqlite:idem.db")],
                  session_manager=FileSessionManager(session_id="order-7"))   # scope: the session

On ``BeforeToolCallEvent`` the tool Strands selected is replaced, for this call only, by one
that runs it through the same engine as ``@idempotent`` (one decorated function per tool),
keyed on the scope, the tool's name and the model's input (less any ``idempotency_key`` the
model wrote). The model calling the tool again after an error it was told of, a hook asking
for a retry (``AfterToolCallEvent.retry``), or a resumed session gets the stored result.

**The scope**, in order: ``scope=`` (a value, or a function of the call's
``invocation_state``), the current ``with idem_runtime.scope(...)``, an ``idem_scope`` the
caller passed in ``invocation_state`` (``agent(prompt, invocation_state={"idem_scope":
job_id})``), else the agent's ``session_id``: a session manager's (the conversation, kept
across restarts), or without one a random id per ``Agent`` object (lost on restart). Within
a session the same charge asked again in a later turn replays too: pass a business id as the
scope where a repeat is a new intent. Never the ``toolUseId``: it is new each time.

**Results.** A result with status ``success`` is stored and replayed (its ``content``, which
must be JSON: text and JSON blocks are); one with status ``error`` (Strands turns the tool's
exception into one) releases the key, so a retry runs again, and reaches the model as it was.
idem's refusals reach the model as an ``error`` result saying what to do: in flight (wait,
do not call again yet), unknown outcome (an operator must resolve it), key reused; "not
configured" (no scope, a store that cannot be opened) is also logged at ERROR on the
``idem_runtime`` logger, since no model can fix it. A replayed result is the stored one
under this call's ``toolUseId``; ``idem inspect KEY`` shows the record and its replays.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from .._requires import requires

with requires("adapters.strands", "strands-agents", "strands-agents 1.62.0"):
    from strands.hooks import BeforeToolCallEvent, HookProvider, HookRegistry
    from strands.types.events import ToolResultEvent
    from strands.types.tools import AgentTool, ToolUse

from .. import errors
from .._scope import Scope
from ._keyed import Fields, KeyedTools, explicit_or_current, first_scope, refusal

StateScope = Union[None, str, Scope, Callable[[Mapping[str, Any]], Union[None, str, Scope]]]

#: The key an invocation may carry its scope under: ``invocation_state={"idem_scope": ...}``.
STATE_SCOPE = "idem_scope"


class IdempotencyHooks(HookProvider):
    """Runs the named tools (``tools=``; every tool when ``None``, which also replays reads:
    name the effects) at most once per (scope, tool, input). ``key_fields={tool: [...]}``;
    other options are ``@idempotent``'s (``store``, ``retention``, ``wait``, ...)."""

    def __init__(
        self,
        tools: Optional[Iterable[str]] = None,
        *,
        scope: StateScope = None,
        key_fields: Optional[Mapping[str, Fields]] = None,
        **options: Any,
    ) -> None:
        self.tools = None if tools is None else frozenset(tools)
        self.scope = scope
        self.keyed = KeyedTools(options, key_fields)

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self._before_tool_call)

    def _before_tool_call(self, event: BeforeToolCallEvent) -> None:
        tool = event.selected_tool
        if tool is None or isinstance(tool, _Idempotent):
            return
        if self.tools is not None and tool.tool_name not in self.tools:
            return
        event.selected_tool = _Idempotent(tool, self, getattr(event.agent, "session_id", None))

    def run_scope(self, name: str, invocation_state: Mapping[str, Any], session_id: Optional[str]) -> str:
        """The scope of a call's key, as the module docstring says; never the toolUseId."""
        found = explicit_or_current(self.scope, invocation_state) or first_scope(
            lambda: invocation_state.get(STATE_SCOPE), lambda: session_id
        )
        if found is None:
            raise errors.ScopeMissingError(
                f"{name}: no scope for its idempotency key, so it was not run: the agent has no "
                f"session id. Pass scope=... to IdempotencyHooks, invocation_state="
                f"{{'{STATE_SCOPE}': job_id}}, or call inside `with idem_runtime.scope(run_id):`"
            )
        return found


class _ToolError(Exception):
    """The tool's own error result: released (a retry runs it again), then given as it was."""

    def __init__(self, event: Any) -> None:
        super().__init__("the tool answered an error result")
        self.event = event


class _Idempotent(AgentTool):
    """One call of ``inner`` through the engine (the tool Strands selected, for this call)."""

    def __init__(self, inner: AgentTool, hooks: IdempotencyHooks, session_id: Optional[str]) -> None:
        super().__init__()
        self.inner = inner
        self.hooks = hooks
        self.session_id = session_id

    @property
    def tool_name(self) -> str:
        return self.inner.tool_name

    @property
    def tool_spec(self) -> Any:
        return self.inner.tool_spec

    @property
    def tool_type(self) -> str:
        return self.inner.tool_type

    async def stream(self, tool_use: ToolUse, invocation_state: Dict[str, Any], **kwargs: Any) -> Any:
        name, use_id = self.tool_name, tool_use.get("toolUseId", "unknown")
        args = tool_use.get("input") or {}
        passed: List[Any] = []  # the tool's own events, given on once it has answered

        async def invoke() -> Dict[str, Any]:
            last = None
            async for event in self.inner.stream(tool_use, invocation_state, **kwargs):
                if isinstance(event, ToolResultEvent):
                    last = event
                else:
                    passed.append(event)
            result = last.tool_result if last is not None else None
            if result is None or result.get("status") != "success":
                raise _ToolError(last)
            return {"status": "success", "content": result.get("content", [])}

        try:
            scope_id = self.hooks.run_scope(name, invocation_state, self.session_id)
            stored, _ = await self.hooks.keyed.call(name, args, scope_id, invoke)
        except _ToolError as e:
            for event in passed:
                yield event
            yield e.event if e.event is not None else _error(use_id, f"{name} gave no result")
            return
        except errors.IdemError as e:
            said = None if isinstance(e, errors.ReplayedError) else refusal(name, e)
            if said is None:
                raise
            yield _error(use_id, said[0])
            return
        for event in passed:
            yield event
        yield ToolResultEvent({"toolUseId": use_id, "status": stored["status"], "content": stored["content"]})


def _error(use_id: str, text: str) -> Any:
    return ToolResultEvent({"toolUseId": use_id, "status": "error", "content": [{"text": text}]})
