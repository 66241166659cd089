"""The README's Google ADK example, runnable offline: an ``LlmAgent`` calls ``charge_card``, the
answer is lost on its way back (a plugin tells the model the call timed out), and the model
asks again; idem's plugin replays the first result, so the card is charged once, and the
replayed answer's event says so in its ``custom_metadata``. The model is a ``BaseLlm`` reading
a script (no LLM is called).

    pip install './clients/python[google-adk]'
    python examples/agents/adk_charge.py              # prints: 1 charge for 2 tool calls
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import InMemoryRunner
from google.genai import types

from idem_runtime.adapters.google_adk import IdempotencyPlugin

charges: list = []  # the side effect: one entry per charge made
USAGE = types.GenerateContentResponseUsageMetadata(prompt_token_count=1, candidates_token_count=1, total_token_count=2)


def charge_card(customer: str, amount_cents: int) -> dict:
    """Charge a customer's card."""
    charges.append((customer, amount_cents))
    return {"charge": f"ch_{len(charges)}", "amount_cents": amount_cents}


class ScriptedLlm(BaseLlm):
    """Asks for the charge until a tool answer is not an error, then answers."""

    model: str = "scripted"

    async def generate_content_async(self, llm_request, stream=False):
        parts = llm_request.contents[-1].parts or []
        answers = [p.function_response.response for p in parts if p.function_response]
        if not answers or "error" in answers[-1]:
            call = types.FunctionCall(id=f"call_{len(llm_request.contents)}", name="charge_card",
                                      args={"customer": "cus_1", "amount_cents": 4900})
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]), usage_metadata=USAGE)
        else:
            text = f"Done: {answers[-1]['charge']}."
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part.from_text(text=text)]), usage_metadata=USAGE)


class LoseTheFirstAnswer(BasePlugin):
    """The network between the tool and the model: the first answer never arrives."""

    def __init__(self):
        super().__init__(name="lossy_link")
        self.calls = 0

    async def after_tool_callback(self, *, tool, tool_args, tool_context, result):
        self.calls += 1
        return {"error": "timed out waiting for the tool's answer"} if self.calls == 1 else None


async def main() -> int:
    lossy = LoseTheFirstAnswer()
    with tempfile.TemporaryDirectory() as tmp:
        idem = IdempotencyPlugin(tools=["charge_card"], store=f"sqlite:{tmp}/idem.db")  # scope: the invocation id
        agent = LlmAgent(name="billing", model=ScriptedLlm(), tools=[charge_card])
        runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=[idem, lossy]))
        session = await runner.session_service.create_session(app_name="shop", user_id="u1")
        message = types.Content(role="user", parts=[types.Part.from_text(text="charge order 7")])
        events = [e async for e in runner.run_async(user_id="u1", session_id=session.id, new_message=message)]
        await runner.close()
    replays = [e.custom_metadata["idem"]["replayed"] for e in events if e.get_function_responses()]
    print(f"{len(charges)} charge for {lossy.calls} tool calls (replayed: {replays}); "
          f"the agent said: {events[-1].content.parts[0].text}")
    return 0 if len(charges) == 1 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
