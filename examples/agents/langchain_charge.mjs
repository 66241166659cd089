// The README's LangChain.js example, runnable offline: a LangChain v1 agent whose tool call is
// answered, the answer lost on its way back, and retried by LangChain's own toolRetryMiddleware;
// idem's middleware replays the first result, so the card is charged once. The model is
// LangChain's scripted fakeModel (no LLM is called).
//
//     npm install idem-runtime langchain @langchain/core @langchain/langgraph zod
//     node langchain_charge.mjs              # prints: 1 charge for 2 tool attempts
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { AIMessage, createAgent, createMiddleware, tool, toolRetryMiddleware } from "langchain";
import { fakeModel } from "@langchain/core/testing";
import { MemorySaver } from "@langchain/langgraph";
import { z } from "zod";

import { idempotencyMiddleware } from "idem-runtime/langchain";

const charges = []; // the side effect: one entry per charge made
const attempts = []; // every time the tool call went out

const chargeCard = tool(
  async ({ customer, amount_cents }) => {
    charges.push({ customer, amount_cents });
    return `charged ${customer} ${amount_cents}`;
  },
  { name: "charge_card", description: "Charge a customer's card", schema: z.object({ customer: z.string(), amount_cents: z.number() }) },
);

// The network between the tool and the agent: the first answer never arrives.
const loseTheFirstAnswer = createMiddleware({
  name: "LoseTheFirstAnswer",
  wrapToolCall: async (request, handler) => {
    attempts.push(request.toolCall.id);
    const answer = await handler(request);
    if (attempts.length === 1) throw new Error("the tool's answer was lost on the way back");
    return answer;
  },
});

const model = fakeModel()
  .respondWithTools([{ name: "charge_card", args: { customer: "cus_1", amount_cents: 4900 }, id: "call_1" }])
  .respond(new AIMessage("Charged cus_1 49 euros."));

const dir = mkdtempSync(join(tmpdir(), "idem-example-"));
try {
  const idem = idempotencyMiddleware({ tools: ["charge_card"], store: `sqlite:${join(dir, "idem.db")}` }); // scope: the thread id
  const agent = createAgent({
    model,
    tools: [chargeCard],
    checkpointer: new MemorySaver(),
    // Outermost first: LangChain's retry, the lossy link, then idem nearest the tool.
    middleware: [toolRetryMiddleware({ maxRetries: 2, initialDelayMs: 0, jitter: false }), loseTheFirstAnswer, idem],
  });
  const result = await agent.invoke({ messages: [{ role: "user", content: "charge order 7" }] }, { configurable: { thread_id: "order-7" } });
  console.log(`${charges.length} charge for ${attempts.length} tool attempts; the agent said: ${result.messages.at(-1).content}`);
  process.exitCode = charges.length === 1 ? 0 : 1;
} finally {
  rmSync(dir, { recursive: true, force: true });
}
