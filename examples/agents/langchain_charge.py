"""The README's LangChain example, runnable offline: a LangChain v1 agent whose tool call is
answered, the answer lost on its way back, and retried by LangChain's own
``ToolRetryMiddleware``; idem's middleware replays the first result, so the card is charged
once. The model is LangChain's ``GenericFakeChatModel`` reading a script (no LLM is called);
it does not implement ``bind_tools``, which ``create_agent`` calls, so the script's model
returns itself there.

    pip install './clients/python[langchain]'
    python examples/agents/langchain_charge.py        # prints: 1 charge for 2 tool attempts
"""

from __future__ import annotations

import sys
import tempfile

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ToolRetryMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from idem_runtime.adapters.langchain import IdempotencyMiddleware

charges: list = []  # the side effect: one entry per charge made
attempts: list = []  # every time the tool's wrapper was entered


@tool
def charge_card(customer: str, amount_cents: int) -> str:
    """Charge a customer's card."""
    charges.append((customer, amount_cents))
    return f"charged {customer} {amount_cents}"


class ScriptedModel(GenericFakeChatModel):
    """LangChain's fake chat model, answering from a script; an agent binds tools first."""

    def bind_tools(self, tools, **kwargs):
        return self


class LoseTheFirstAnswer(AgentMiddleware):
    """The network between the tool and the agent: the first answer never arrives."""

    def wrap_tool_call(self, request, handler):
        attempts.append(request.tool_call["id"])
        result = handler(request)
        if len(attempts) == 1:
            raise TimeoutError("the tool's answer was lost on the way back")
        return result


def main() -> int:
    script = iter([
        AIMessage("", tool_calls=[{"name": "charge_card", "args": {"customer": "cus_1", "amount_cents": 4900}, "id": "call_1"}]),
        AIMessage("Charged cus_1 49 euros."),
    ])
    with tempfile.TemporaryDirectory() as tmp:
        idem = IdempotencyMiddleware(tools=["charge_card"], store=f"sqlite:{tmp}/idem.db")  # scope: the thread id
        agent = create_agent(
            ScriptedModel(messages=script),
            [charge_card],
            checkpointer=InMemorySaver(),
            # Outermost first: LangChain's retry, the lossy link, then idem nearest the tool.
            middleware=[ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False), LoseTheFirstAnswer(), idem],
        )
        result = agent.invoke({"messages": [("user", "charge order 7")]}, {"configurable": {"thread_id": "order-7"}})
    print(f"{len(charges)} charge for {len(attempts)} tool attempts; the agent said: {result['messages'][-1].content}")
    return 0 if len(charges) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
