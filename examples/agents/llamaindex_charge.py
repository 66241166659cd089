"""The README's LlamaIndex example, runnable offline: a ``FunctionAgent`` calls ``charge_card``,
the answer is lost on its way back (the agent is told it timed out), and the model asks again;
idem's wrapper replays the first result, so the card is charged once. The model is
LlamaIndex's own ``MockFunctionCallingLLM`` answering from a script (no LLM is called).

    pip install './clients/python[llamaindex]'
    python examples/agents/llamaindex_charge.py       # prints: 1 charge for 2 tool calls
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool, ToolOutput
from llama_index.core.workflow import Context

from idem_runtime.adapters.llamaindex import idempotent_tool

charges: list = []  # the side effect: one entry per charge made
calls: list = []  # every call the agent made


def charge_card(customer: str, amount_cents: int) -> str:
    """Charge a customer's card."""
    charges.append((customer, amount_cents))
    return f"charged {customer} {amount_cents}"


def model(messages, **kwargs) -> ChatMessage:
    """The script: ask for the charge until a tool answer is not an error, then answer."""
    answers = [m for m in messages if m.role == MessageRole.TOOL]
    if not answers or "timed out" in (answers[-1].content or ""):
        call = ToolCallBlock(tool_call_id=f"call_{len(answers) + 1}", tool_name="charge_card",
                             tool_kwargs={"customer": "cus_1", "amount_cents": 4900})
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])
    return ChatMessage(role=MessageRole.ASSISTANT, content=f"Done: {answers[-1].content}.")


def lose_the_first_answer(tool: FunctionTool) -> FunctionTool:
    """The network between the tool and the agent: the first answer never arrives."""

    async def never(**_):
        raise AssertionError

    class Lossy(FunctionTool):
        async def acall(self, *args, **kwargs):
            calls.append(1)
            out = await tool.acall(*args, **kwargs)
            if len(calls) == 1:
                return ToolOutput(tool_name="charge_card", content="Error: timed out", raw_input=kwargs,
                                  raw_output=None, is_error=True)
            return out

    lossy = Lossy(async_fn=never, metadata=tool.metadata)
    lossy.requires_context, lossy.ctx_param_name = tool.requires_context, tool.ctx_param_name
    return lossy


async def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        charge = idempotent_tool(FunctionTool.from_defaults(charge_card), store=f"sqlite:{tmp}/idem.db")
        agent = FunctionAgent(tools=[lose_the_first_answer(charge)], llm=MockFunctionCallingLLM(response_generator=model))
        ctx = Context(agent)
        await ctx.store.set("idem_scope", "order-7")  # a business id; without it, this run's id
        result = await agent.run("charge order 7", ctx=ctx)
    print(f"{len(charges)} charge for {len(calls)} tool calls; the agent said: {result}")
    return 0 if len(charges) == 1 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
