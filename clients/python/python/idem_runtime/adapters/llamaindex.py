"""LlamaIndex: tools that run at most once per intent::

    from idem_runtime.adapters.llamaindex import idempotent_tool

    charge = idempotent_tool(FunctionTool.from_defaults(charge_card), store="sqlite:idem.db")
    agent = FunctionAgent(tools=[charge, lookup], llm=llm)   # or AgentWorkflow(agents=[...])
    await agent.run("charge order 7", ctx=ctx)               # scope: this workflow run's id

``idempotent_tool`` answers a ``FunctionTool`` that runs the tool it was given (a
``FunctionTool``, or any LlamaIndex tool) through the same engine as ``@idempotent`` (one
decorated function per tool), keyed on the scope, the tool's name and the model's arguments
(less any ``idempotency_key`` the model wrote). The model calling the tool again after an error
or a timeout it was told about, or another agent of the workflow asking the same, gets the
stored result.

**The scope**, in order: ``scope=`` (a value, or a function of the call's arguments, e.g.
``lambda args: args["order_id"]``), the current ``with idem_runtime.scope(...)``, an
``idem_scope`` in the workflow's ``Context`` (``await ctx.store.set("idem_scope", order_id)``:
kept with the Context, so every agent of an ``AgentWorkflow``, every later run on that
Context and a Context restored from ``ctx.to_dict()`` share it), else the workflow run's id
(``agent.run(..., run_id=...)``; by default a new random id per ``run()``, which a step sees
as the ``llamaindex.run_id`` instrumentation tag). A new ``run()`` is a new intent, so a human
sending the same instruction again, or a run restarted after a crash, charges again unless
the scope names what they share (the order, the job) through ``scope=``, ``run_id=`` or the
Context. Never the tool call's id: it is new each time the model asks. The Context reaches
the tool because the answered tool asks for it, as a ``FunctionTool`` with a ``Context``
parameter does (``AgentWorkflow``, ``FunctionAgent`` and ``ReActAgent`` pass it); the tool
given is called with it only if it asks for it too. ``CodeActAgent`` refuses such tools (it
calls their functions itself, which idem could not key).

**Results.** A ``ToolOutput`` is stored as its content blocks and its ``raw_output`` (as
JSON; a value JSON cannot hold is kept as its text) and replayed as a ``ToolOutput``; its
``raw_input`` carries ``{"idem": {"key": ..., "replayed": ...}}`` beside the arguments (the
model does not see it; ``idem inspect KEY`` shows the record). A ``ToolOutput`` with
``is_error`` (the tool's own failure report) is given as it was and releases the key; the
tool's exception releases it too, unless ``keep_errors=`` or ``unknown_errors=`` list it,
and reaches LlamaIndex as before.

**Errors LlamaIndex would swallow.** An agent turns any exception a tool raises into a tool
output the model reads, and the run goes on. So idem's own answers come back as a
``ToolOutput`` with ``is_error=True`` saying what the model may do (the same sentences as the
other adapters'): *not configured* (no scope: a tool called outside a workflow run and
any ``scope``; arguments no key can be derived from) and *store unavailable* are also logged
at ERROR on the ``idem_runtime`` logger, since no model can fix them (route that logger to
your alerts, or call the tool outside an agent, where nothing is swallowed: ``tool.call``
answers the same output); *in flight* ("do not call it again yet"), *unknown outcome* (an
operator must resolve the key) and *key reused* tell the model what it may do.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from .._requires import requires

with requires("adapters.llamaindex", "llamaindex", "llama-index-core 0.14.25"):
    from llama_index.core.base.llms.types import ContentBlock
    from llama_index.core.tools import FunctionTool, ToolOutput
    from llama_index.core.tools.types import BaseTool, adapt_to_async_tool
    from llama_index.core.workflow import Context
    from llama_index_instrumentation.dispatcher import active_instrument_tags
    from pydantic import TypeAdapter

from .. import errors
from .._decorator import Outcome
from .._scope import Scope
from ._keyed import Fields, KeyedTools, as_json, explicit_or_current, first_scope, idem_metadata, refusal

ArgsScope = Union[None, str, Scope, Callable[[Mapping[str, Any]], Union[None, str, Scope]]]

#: The key of the Context's store a caller may put the scope under.
CONTEXT_SCOPE = "idem_scope"
#: The keyword argument an agent passes the workflow's Context under (to the answered tool).
_CTX = "idem_workflow_context"
#: The instrumentation tag a workflow run sets, for its steps, to the run's id.
_RUN_ID_TAG = "llamaindex.run_id"

_blocks = TypeAdapter(List[ContentBlock])


def run_id() -> Optional[str]:
    """The id of the workflow run this step belongs to, or ``None`` outside a run."""
    return active_instrument_tags.get().get(_RUN_ID_TAG) or None


def run_scope(name: str, args: Mapping[str, Any], scope: ArgsScope = None, in_context: Any = None) -> str:
    """The scope of a call's key, as the module docstring says (``in_context``: the Context's
    ``idem_scope``, read by the caller); never the tool call's id."""
    found = explicit_or_current(scope, args) or first_scope(lambda: in_context, run_id)
    if found is None:
        raise errors.ScopeMissingError(
            f"{name}: no scope for its idempotency key, so it was not run: it was called outside a "
            f"workflow run. Pass scope=... to idempotent_tool (an order or job id), set "
            f"'{CONTEXT_SCOPE}' in the workflow's Context, or call it inside "
            f"`with idem_runtime.scope(run_id):`"
        )
    return found


def idempotent_tool(tool: BaseTool, *, scope: ArgsScope = None, key_fields: Fields = None, **options: Any) -> FunctionTool:
    """A ``FunctionTool`` with ``tool``'s metadata whose calls run ``tool`` at most once per
    (scope, tool, arguments). ``options`` are ``@idempotent``'s (``store``, ``retention``,
    ``wait``, ``keep_errors``, ...)."""
    if not isinstance(tool, BaseTool):
        raise errors.ConfigurationError(
            f"idempotent_tool takes a LlamaIndex tool (FunctionTool.from_defaults(fn), or any "
            f"llama_index.core.tools.BaseTool), not {tool!r}"
        )
    return _Idempotent(tool, KeyedTools(options, {tool.metadata.get_name(): key_fields}), scope)


async def _never(**_: Any) -> Any:
    raise AssertionError("the answered tool runs its own call()/acall()")


class _Idempotent(FunctionTool):
    """``inner`` through the engine. A ``FunctionTool`` that asks for the Context (under a
    name of idem's), so that an agent passes it; ``inner`` gets it only if it asks too."""

    def __init__(self, inner: BaseTool, keyed: KeyedTools, scope: ArgsScope) -> None:
        super().__init__(async_fn=_never, metadata=inner.metadata)
        self.requires_context = True
        self.ctx_param_name = _CTX
        self.inner = inner
        self.keyed = keyed
        self.scope = scope
        self.name = inner.metadata.get_name()

    def _inner_kwargs(self, kwargs: Dict[str, Any], ctx: Optional[Context]) -> Dict[str, Any]:
        wants = getattr(self.inner, "ctx_param_name", None) if getattr(self.inner, "requires_context", False) else None
        return {**kwargs, wants: ctx} if wants and ctx is not None else kwargs

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        ctx = kwargs.pop(_CTX, None)
        call = _Call(self.name, kwargs)

        async def body() -> Dict[str, Any]:
            call.ran = True
            return call.kept(await adapt_to_async_tool(self.inner).acall(**self._inner_kwargs(kwargs, ctx)))

        try:
            _positional(self.name, args)
            in_context = await ctx.store.get(CONTEXT_SCOPE, default=None) if ctx is not None else None
            scope_id = run_scope(self.name, kwargs, self.scope, in_context)
            return call.answer(*await self.keyed.call(self.name, kwargs, scope_id, body))
        except Exception as e:
            return call.failed(e)

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """The synchronous call (outside an agent, which calls ``acall``): the scope is
        ``scope=``, ``with idem_runtime.scope(...)`` or the run's id (the Context's store is
        read only by ``acall``)."""
        ctx = kwargs.pop(_CTX, None)
        call = _Call(self.name, kwargs)

        def body() -> Dict[str, Any]:
            call.ran = True
            return call.kept(self.inner.call(**self._inner_kwargs(kwargs, ctx)))

        try:
            _positional(self.name, args)
            return call.answer(*self.keyed.call_sync(self.name, kwargs, run_scope(self.name, kwargs, self.scope), body))
        except Exception as e:
            return call.failed(e)


class _NotStored(Exception):
    """The tool reported a failure (a ToolOutput with is_error): released, given as it was."""


class _Call:
    """One call: whether the engine ran the tool, and what the tool answered."""

    def __init__(self, name: str, kwargs: Dict[str, Any]) -> None:
        self.name = name
        self.kwargs = kwargs
        self.ran = False
        self.output: Optional[ToolOutput] = None

    def kept(self, output: ToolOutput) -> Dict[str, Any]:
        """What the engine stores of the tool's output; an error output is not stored."""
        self.output = output
        if output.is_error:
            raise _NotStored()
        return {"blocks": [b.model_dump(mode="json") for b in output.blocks], "raw_output": as_json(output.raw_output)}

    def answer(self, stored: Dict[str, Any], outcome: Outcome) -> ToolOutput:
        """The tool's own output where this call ran it, else the stored one rebuilt; either
        with the key and whether it is a replay in ``raw_input["idem"]``."""
        output = self.output if not outcome.replayed and self.output is not None else ToolOutput(
            tool_name=self.name, blocks=_blocks.validate_python(stored["blocks"]),
            raw_input={"args": (), "kwargs": self.kwargs}, raw_output=stored["raw_output"],
        )
        output.raw_input = {**(output.raw_input or {}), **idem_metadata(outcome)}
        return output

    def failed(self, e: Exception) -> ToolOutput:
        """The engine raised: the tool's own error output, or its exception raised (as
        LlamaIndex shows one; an idem refusal of an ``@idempotent`` call inside it included),
        or, where the tool did not run, idem's refusal as an error output."""
        if isinstance(e, _NotStored) and self.output is not None:
            return self.output
        if self.ran or not isinstance(e, errors.IdemError):
            raise e
        said = None if isinstance(e, errors.ReplayedError) else refusal(self.name, e)
        if said is None:
            raise e  # an error the first call kept (keep_errors=), replayed as the tool's own
        return ToolOutput(tool_name=self.name, content=said[0], raw_input={"args": (), "kwargs": self.kwargs},
                          raw_output=None, is_error=True, exception=e)


def _positional(name: str, args: Tuple[Any, ...]) -> None:
    """Agents call tools with keyword arguments; a positional one could not be keyed by name."""
    if args:
        raise errors.ConfigurationError(
            f"{name}: idempotent_tool keys a call on its keyword arguments (as LlamaIndex's agents "
            f"pass them); this call passed {len(args)} positional"
        )

