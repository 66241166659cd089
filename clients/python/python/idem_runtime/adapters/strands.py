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
job_id})``), else the agent's session: a session manager's ``session_id`` (the
conversation, kept across restarts), or without one a uuid4 idem keeps per ``Agent`` object
(lost on restart). Within
a session the same charge asked again in a later turn replays too: pass a business id as the
scope where a repeat is a new intent. Never the ``toolUseId``: it is new each time.

**Results.** A result with status ``success`` is stored and replayed (its ``content``, bytes
included); one with status ``error`` (Strands turns the tool's exception into one) reaches
the model as it was, and the tool's exception decides as for ``@idempotent``: released (a
retry runs again), kept (``keep_errors=``: replayed as an error result) or unknown
(``unknown_errors=``: later calls are refused until an operator resolves the key). A tool
that yields plain values has its last one as its result, as Strands reads it. Strands'
structured-output tool and agents used as tools are never wrapped.
idem's refusals reach the model as an ``error`` result saying what to do: in flight (wait,
do not call again yet), unknown outcome (an operator must resolve it), key reused; "not
configured" (no scope, a store that cannot be opened) is also logged at ERROR on the
``idem_runtime`` logger, since no model can fix it. A replayed result is the stored one
under this call's ``toolUseId``; ``idem inspect KEY`` shows the record and its replays.
"""

from __future__ import annotations

import base64
import uuid
import weakref
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from .._requires import requires

with requires("adapters.strands", "strands-agents", "strands-agents 1.62.0"):
    from strands.hooks import BeforeToolCallEvent, HookProvider, HookRegistry
    from strands.types._events import ToolInterruptEvent, ToolStreamEvent
    from strands.types.events import ToolResultEvent
    from strands.types.tools import AgentTool, ToolUse

from .. import errors
from .._scope import Scope
from ._keyed import Fields, KeyedTools, explicit_or_current, first_scope, refusal

StateScope = Union[None, str, Scope, Callable[[Mapping[str, Any]], Union[None, str, Scope]]]

#: The key an invocation may carry its scope under: ``invocation_state={"idem_scope": ...}``.
STATE_SCOPE = "idem_scope"

#: Tools that are never wrapped: Strands' structured output (it keeps its answer in the call's
#: context, which a replay would not fill) and agents as tools (their own tools are the effects).
_NOT_EFFECTS = frozenset({"structured_output", "agent"})


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
        if isinstance(tools, str):
            raise errors.ConfigurationError(f"tools is a list of tool names, such as [{tools!r}], not one string")
        self.tools = None if tools is None else frozenset(tools)
        self.scope = scope
        self.keyed = KeyedTools(options, key_fields)
        # An agent without a session manager: a uuid4 of idem's own per Agent object (Strands'
        # own id is 32 random bits, too few to keep unrelated agents' keys apart in one store).
        self._agents: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self._before_tool_call)

    def _before_tool_call(self, event: BeforeToolCallEvent) -> None:
        tool = event.selected_tool
        if tool is None or isinstance(tool, _Idempotent) or tool.tool_type in _NOT_EFFECTS:
            return
        if self.tools is not None and tool.tool_name not in self.tools:
            return
        event.selected_tool = _Idempotent(tool, self, self._session(event.agent))

    def _session(self, agent: Any) -> Optional[str]:
        """The agent's session id where a session manager gives one, else idem's id for it."""
        if getattr(agent, "_session_manager", None) is not None:
            return getattr(agent, "session_id", None)
        try:
            return self._agents.setdefault(agent, uuid.uuid4().hex)
        except TypeError:  # not weakly referenceable: Strands' own id
            return getattr(agent, "session_id", None)

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


class _NotStored(Exception):
    """The tool answered without a result to keep (an error result, or an interrupt): the
    key is released, so a retry runs it again, and what it answered is given as it was."""


class _Call:
    """What one run of the tool answered: the events to pass on, and the result."""

    def __init__(self) -> None:
        self.ran = False
        self.passed: List[Any] = []
        self.result: Any = None  # the ToolResultEvent to give, when not the stored one


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
        name, use_id = self.tool_name, str(tool_use.get("toolUseId", "unknown"))
        args = tool_use.get("input") or {}
        call = _Call()

        async def invoke() -> Dict[str, Any]:
            call.ran = True
            result = await _run(self.inner, tool_use, invocation_state, kwargs, call)
            if result.tool_result.get("status") != "success":
                call.result = result
                # The tool's own exception, where it raised one, so that keep_errors= and
                # unknown_errors= decide as they do for @idempotent; else released.
                raise result.exception if result.exception is not None else _NotStored()
            return {"status": "success", "content": _stored(result.tool_result.get("content", []))}

        try:
            scope_id = self.hooks.run_scope(name, invocation_state, self.session_id)
            stored, _ = await self.hooks.keyed.call(name, args, scope_id, invoke)
        except Exception as e:
            if call.ran:
                # What the tool itself answered (an error result, an interrupt), as it was.
                for event in call.passed:
                    yield event
                if call.result is not None:
                    yield call.result
                return
            said = refusal(name, e) if isinstance(e, errors.IdemError) and not isinstance(e, errors.ReplayedError) else None
            if said is not None:
                yield _error(use_id, said[0])
            else:
                # An error the first call kept (keep_errors=), replayed: as Strands shows one.
                yield _error(use_id, f"Error: {type(e).__name__} - {e}")
            return
        for event in call.passed:
            yield event
        yield ToolResultEvent({"toolUseId": use_id, "status": stored["status"], "content": _restored(stored["content"])})


async def _run(inner: AgentTool, tool_use: ToolUse, invocation_state: Dict[str, Any], kwargs: Dict[str, Any], call: _Call) -> Any:
    """Runs the tool as Strands' executor does: a ToolResultEvent ends it; a tool that yields
    plain values has its last one as the result; an interrupt ends it without one; an
    exception is an error result. The other events are kept for ``call.passed``."""
    last_raw: Any = None
    yielded = False
    try:
        async for event in inner.stream(tool_use, invocation_state, **kwargs):
            if isinstance(event, ToolInterruptEvent):
                call.passed.append(event)
                raise _NotStored()
            if isinstance(event, ToolResultEvent):
                return event
            call.passed.append(event if isinstance(event, ToolStreamEvent) else ToolStreamEvent(tool_use, event))
            yielded, last_raw = True, event
    except _NotStored:
        raise
    except Exception as error:
        return ToolResultEvent(
            {"toolUseId": str(tool_use.get("toolUseId")), "status": "error", "content": [{"text": f"Error: {error}"}]},
            exception=error,
        )
    if not yielded:
        return ToolResultEvent(
            {"toolUseId": str(tool_use.get("toolUseId")), "status": "error",
             "content": [{"text": f"Tool '{tool_use.get('name')}' did not return a result"}]}
        )
    call.passed.pop()  # the last raw value is the result, not an event of its own
    return ToolResultEvent(last_raw)


#: How bytes (an image's, a document's) are kept in a stored result, which is JSON.
_BYTES = "$idem_bytes"


def _stored(value: Any) -> Any:
    """A result's content as JSON: bytes as base64 under ``_BYTES``, restored on replay."""
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {k: _stored(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stored(v) for v in value]
    return value


def _restored(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_BYTES} and isinstance(value[_BYTES], str):
            return base64.b64decode(value[_BYTES])
        return {k: _restored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restored(v) for v in value]
    return value


def _error(use_id: str, text: str) -> Any:
    return ToolResultEvent({"toolUseId": use_id, "status": "error", "content": [{"text": text}]})
