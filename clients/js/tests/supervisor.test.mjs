// The fourth retry path, with real frameworks and scripted models (no LLM): a supervisor agent
// (the AI SDK) delegates charge_card to a worker agent, the worker stalls after charging so its
// answer never comes, the supervisor's delegation times out and it re-delegates to a second
// worker. The scope is handed down as the README says (`scope.toJSON()` in the hand-off,
// `Scope.from` in the worker), so both workers derive one key: one charge. And a human who
// re-sends the instruction as a new message in the same thread (a LangChain agent), with the
// order id as the scope: one charge. Each charge is a request to a payment service on loopback.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { AIMessage, ToolMessage, createAgent, tool as lcTool } from "langchain";
import { fakeModel } from "@langchain/core/testing";
import { MemorySaver } from "@langchain/langgraph";
import { z } from "zod";

import { Scope, currentScope, deriveKey, withScope } from "../index.js";
import { withIdempotency } from "../ai.js";
import { idempotencyMiddleware } from "../langchain.js";
import { chargeService, inspect, tmp } from "./helpers.mjs";

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
const ARGS = { customer: "cus_sup", amount_cents: 4900 };
const toolCall = (id, toolName, input) => ({
  content: [{ type: "tool-call", toolCallId: id, toolName, input: JSON.stringify(input) }],
  finishReason: { unified: "tool-calls", raw: undefined },
  usage,
  warnings: [],
});
const text = (t) => ({ content: [{ type: "text", text: t }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] });
const lastToolOutput = (prompt) => {
  const last = prompt.at(-1);
  return last?.role === "tool" ? last.content.at(-1).output : undefined;
};

/** Worker `n`: calls charge_card; then the first worker stalls until it is aborted, the second reports. */
function workerModel(n) {
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt, abortSignal }) => {
      const output = lastToolOutput(prompt);
      if (output === undefined) return toolCall(`w${n}_call`, "charge_card", ARGS);
      if (n === 1) {
        await new Promise((_, reject) => abortSignal.addEventListener("abort", () => reject(abortSignal.reason), { once: true }));
      }
      return text(`charged: ${JSON.stringify(output.value)}`);
    },
  });
}

/** The supervisor: delegates; after a delegation that failed (timed out), delegates again; then answers. */
function supervisorModel() {
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      const output = lastToolOutput(prompt);
      const delegations = prompt.filter((m) => m.role === "tool").length;
      if (output === undefined || (output.type === "error-text" && delegations < 2)) {
        return toolCall(`sup_${delegations + 1}`, "delegate", { task: "charge cus_sup 49 euros" });
      }
      return text(`done: ${JSON.stringify(output.value)}`);
    },
  });
}

async function supervise(chargeCard) {
  let workers = 0;
  const delegate = tool({
    description: "Hands a task to a worker agent",
    inputSchema: z.object({ task: z.string() }),
    execute: async ({ task }) => {
      const n = ++workers;
      // The hand-off: what a queue message, a worker thread or another process would receive.
      const handoff = JSON.stringify({ task, scope: currentScope() });
      const abort = new AbortController();
      const timer = setTimeout(() => abort.abort(new Error(`worker ${n} timed out`)), 300);
      try {
        const { task: job, scope } = JSON.parse(handoff);
        const run = await withScope(Scope.from(scope), () =>
          generateText({ model: workerModel(n), tools: { charge_card: chargeCard }, prompt: job, stopWhen: stepCountIs(4), abortSignal: abort.signal }),
        );
        return run.text;
      } finally {
        clearTimeout(timer);
      }
    },
  });
  const result = await withScope("task-42", () =>
    generateText({ model: supervisorModel(), tools: { delegate }, prompt: "charge cus_sup 49 euros", stopWhen: stepCountIs(5) }),
  );
  return { result, workers };
}

function chargeTool(service) {
  return tool({
    description: "Charges a card",
    inputSchema: z.object({ customer: z.string(), amount_cents: z.number() }),
    execute: (args) => service.charge(args),
  });
}

test("a supervisor re-delegates after a worker stalls: the second worker replays, one charge", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const { result, workers } = await supervise(withIdempotency(chargeTool(service), { tool: "charge_card", store }));
  assert.equal(workers, 2, "delegated twice");
  assert.equal(service.charges.length, 1, "one charge");
  assert.match(result.text, /ch_1/);
  assert.match(inspect(deriveKey("task-42", "charge_card", ARGS), store), /replays\W+1/);
});

test("without idem the re-delegation charges twice (the test can fail)", async (t) => {
  const service = await chargeService(t);
  const { workers } = await supervise(chargeTool(service));
  assert.equal(workers, 2);
  assert.equal(service.charges.length, 2);
});

/** A human sends "charge order N" in a thread; the first turn fails after the charge; they send it again. */
async function humanResends(service, middleware) {
  const charge = lcTool(async (args) => JSON.stringify(await service.charge(args)), {
    name: "charge_card",
    description: "Charges an order",
    schema: z.object({ order_id: z.string(), amount_cents: z.number() }),
  });
  const order = { order_id: "ord_7", amount_cents: 4900 };
  const model = fakeModel()
    .respondWithTools([{ name: "charge_card", args: order, id: "turn1" }])
    .respond(new Error("connection reset: the answer never reached the human"))
    .respondWithTools([{ name: "charge_card", args: order, id: "turn2" }])
    .respond(new AIMessage("charged order 7"))
    .respondWithTools([{ name: "charge_card", args: { order_id: "ord_8", amount_cents: 4900 }, id: "turn3" }])
    .respond(new AIMessage("charged order 8"));
  const agent = createAgent({ model, tools: [charge], middleware, checkpointer: new MemorySaver() });
  const thread = { configurable: { thread_id: "support-thread-1" } };
  const say = (content) => agent.invoke({ messages: [{ role: "user", content }] }, thread);
  await assert.rejects(say("charge order 7"), /connection reset/);
  const again = await say("charge order 7 (sent again: no answer came)");
  const other = await say("now charge order 8");
  return { again, other };
}

test("a human re-sends the instruction in the same thread, scope = the order id: one charge per order", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const idem = idempotencyMiddleware({ tools: ["charge_card"], store, scope: (call) => `order-${call.args.order_id}` });
  const { again } = await humanResends(service, [idem]);
  assert.deepEqual(service.charges.map((c) => c.order_id), ["ord_7", "ord_8"], "order 7 once, then order 8");
  const replay = again.messages.filter((m) => ToolMessage.isInstance(m)).at(-1);
  assert.equal(replay.response_metadata.idem.replayed, true);
  assert.equal(replay.response_metadata.idem.key, deriveKey("order-ord_7", "charge_card", { order_id: "ord_7", amount_cents: 4900 }));
});

test("without idem the re-sent instruction charges order 7 twice (the test can fail)", async (t) => {
  const service = await chargeService(t);
  await humanResends(service, []);
  assert.deepEqual(service.charges.map((c) => c.order_id), ["ord_7", "ord_7", "ord_8"]);
});
