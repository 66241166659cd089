"""The supervisor path (issue 31, item 4) with a real framework: a LangGraph supervisor (a
LangChain v1 ``create_agent`` whose tool delegates to worker agents, each a ``create_agent`` of
its own with ``IdempotencyMiddleware``), scripted models only.

1. The supervisor delegates "charge order 7" to worker 1. Worker 1 charges (a row in the
   payments table; idem stores the result) and then stalls: its model never answers. The
   supervisor's delegation times out, it is told so, and it re-delegates the same task to
   worker 2, handing down the task's scope as docs/python.md says (``Scope(...).dumps()`` with
   the task; the worker runs inside ``with scope(Scope.loads(handoff))``): one row, worker 2's
   answer a replay. Without idem: two rows. With idem but each worker keyed on a scope of its
   own (its own thread: the scope not handed down): two rows.
2. A human sends the instruction again, as a new message in the same thread (the first answer
   never reached them). The supervisor's task scope is per request (the human message it
   serves), so that is a new task: two rows; with the order id as the scope handed down (a
   business id), one.

Run: cd clients/python/tests && python -m unittest test_supervisor (IDEM_BIN for the CLI).
"""

import asyncio
import unittest
import uuid

import cli_support
from agent_effects import Payments
from cli_support import need


def missing():
    try:
        import langchain.agents  # noqa: F401
        import langgraph.checkpoint.memory  # noqa: F401
    except ImportError as e:
        return f"langchain/langgraph are not installed ({e}); see tests/requirements.txt for the pinned versions"
    return cli_support.cli_missing()


WHY = missing()
ORDER = {"customer": "cus_1", "amount_cents": 4900}
TIMEOUT = 1.0  # how long the supervisor waits for a worker's answer, in seconds


def delegate_call(call_id):
    from langchain_core.messages import AIMessage

    args = {"order_id": "order-7", "instruction": "charge cus_1 49.00 for order 7"}
    return AIMessage("", tool_calls=[{"name": "delegate_billing", "args": args, "id": call_id}])


def scripted(messages, stall_after_tool=False):
    """LangChain's fake chat model answering from ``messages`` (agents bind tools to it
    first); with ``stall_after_tool`` it never answers once it has a tool result: a stalled
    worker."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import ToolMessage

    class Scripted(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

        async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
            if stall_after_tool and any(isinstance(m, ToolMessage) for m in messages):
                await asyncio.sleep(3600)  # cancelled by the supervisor's timeout
            return self._generate(messages, stop=stop, **kwargs)

    return Scripted(messages=iter(messages))


@need(WHY)
class SupervisorTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        from langchain_core.tools import tool

        self.pay = Payments(self)

        @tool
        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            return self.pay.charge(customer, amount_cents)

        self.charge_card = charge_card
        self.worker_answers = []

    def worker(self, n, stall, idem, handed_down):
        """A billing worker: its own agent, model and thread; it charges, then (``stall``) its
        model never answers. ``handed_down``: idem keys on the scope its supervisor hands
        down; else on the worker's own thread (the LangChain adapter's default)."""
        from langchain.agents import create_agent
        from langchain_core.messages import AIMessage

        from idem_runtime import current_scope
        from idem_runtime.adapters.langchain import IdempotencyMiddleware

        charge = AIMessage("", tool_calls=[{"name": "charge_card", "args": dict(ORDER), "id": f"w{n}-call-1"}])
        middleware = []
        if idem:
            middleware.append(IdempotencyMiddleware(
                tools=["charge_card"], store=self.pay.store,
                scope=(lambda request: current_scope()) if handed_down else None))
        return create_agent(scripted([charge, AIMessage(f"worker {n}: charged")], stall_after_tool=stall),
                            [self.charge_card], middleware=middleware)

    def supervisor(self, script, idem=True, handed_down=True, task_scope="request"):
        """The supervisor: an agent whose one tool, ``delegate_billing``, gives the task to the
        next free worker (worker 1 stalls) with the task's scope, and waits ``TIMEOUT`` for
        its answer. ``task_scope``: "request" (the thread and the human message being
        served: a re-delegation is the same task, a new message a new one) or "order" (the
        order id, a business id)."""
        from langchain.agents import create_agent
        from langchain_core.messages import HumanMessage
        from langchain_core.tools import tool
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.prebuilt import ToolRuntime

        from idem_runtime import Scope, scope

        workers = [self.worker(1, True, idem, handed_down), self.worker(2, False, idem, handed_down),
                   self.worker(3, False, idem, handed_down)]
        answers = self.worker_answers

        @tool
        async def delegate_billing(order_id: str, instruction: str, runtime: ToolRuntime) -> str:
            """Give a billing task to a billing worker and return its answer."""
            if task_scope == "order":
                task = Scope(order_id)
            else:
                request = [m for m in runtime.state["messages"] if isinstance(m, HumanMessage)][-1]
                task = Scope(runtime.config["configurable"]["thread_id"]).child(request.id)
            handoff = task.dumps()  # what travels with the task to the worker
            worker = workers.pop(0)

            async def run_worker():
                with scope(Scope.loads(handoff)):
                    own_thread = {"configurable": {"thread_id": f"worker-{uuid.uuid4().hex}"}}
                    return await worker.ainvoke({"messages": [("user", instruction)]}, own_thread)

            try:
                result = await asyncio.wait_for(run_worker(), TIMEOUT)
            except asyncio.TimeoutError:
                return "error: the billing worker did not answer in time; its task may or may not have run"
            answers.append(result["messages"][-2])  # the worker's ToolMessage
            return result["messages"][-1].content

        return create_agent(scripted(script), [delegate_billing], checkpointer=InMemorySaver())

    async def ask(self, agent, text, thread="support-7"):
        return await agent.ainvoke({"messages": [("user", text)]}, {"configurable": {"thread_id": thread}})

    REDELEGATE = staticmethod(lambda: [delegate_call("d1"), delegate_call("d2"), _final("order 7 is charged")])

    async def test_a_re_delegation_after_a_stalled_worker_charges_once(self):
        agent = self.supervisor(self.REDELEGATE())
        result = await self.ask(agent, "charge order 7")
        self.assertEqual(self.pay.rows(), 1, "worker 1 charged and stalled; worker 2 was answered by idem")
        self.assertEqual(result["messages"][-1].content, "order 7 is charged")
        tool_messages = [m for m in result["messages"] if m.type == "tool"]
        self.assertIn("did not answer in time", tool_messages[0].content)
        self.assertEqual(tool_messages[1].content, "worker 2: charged")
        replay = self.worker_answers[0].response_metadata["idem"]
        self.assertTrue(replay["replayed"])
        self.assertIn("completed", self.pay.inspect(replay["key"]))

    async def test_without_idem_the_re_delegation_charges_twice(self):
        await self.ask(self.supervisor(self.REDELEGATE(), idem=False), "charge order 7")
        self.assertEqual(self.pay.rows(), 2)

    async def test_without_the_scope_handed_down_it_charges_twice(self):
        await self.ask(self.supervisor(self.REDELEGATE(), handed_down=False), "charge order 7")
        self.assertEqual(self.pay.rows(), 2, "each worker keyed on its own thread: two intents")

    async def test_a_human_re_sending_in_the_same_thread_charges_once_with_the_order_as_scope(self):
        script = [delegate_call("d1"), delegate_call("d2"), _final("order 7 is charged"),
                  delegate_call("d3"), _final("order 7 is charged")]
        # The task is the request: the re-sent message is a new one, and so a new charge.
        agent = self.supervisor(script)
        await self.ask(agent, "charge order 7")
        await self.ask(agent, "charge order 7 (I did not get an answer)")
        self.assertEqual(self.pay.rows(), 2)
        # The order id handed down as the scope: the re-sent instruction is the same intent.
        self.pay = Payments(self)
        agent = self.supervisor(script, task_scope="order")
        await self.ask(agent, "charge order 7")
        again = await self.ask(agent, "charge order 7 (I did not get an answer)")
        self.assertEqual(self.pay.rows(), 1)
        self.assertEqual([a.response_metadata["idem"]["replayed"] for a in self.worker_answers[-2:]], [True, True])
        self.assertEqual(again["messages"][-1].content, "order 7 is charged")
        import idem_runtime

        self.assertIn("completed", self.pay.inspect(idem_runtime.derive_key("order-7", "charge_card", ORDER)))


def _final(text):
    from langchain_core.messages import AIMessage

    return AIMessage(text)


if __name__ == "__main__":
    unittest.main()
