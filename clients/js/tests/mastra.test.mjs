// Mastra (@mastra/core 0.24.9, the last version whose `engines` allow Node.js 20) with a scripted
// AI SDK v2 model (no LLM): an Agent calls charge_card, the result is lost on its way back once,
// the model calls it again with a new tool-call id in the same run, and the card is charged once.
// A charge is a real request to a payment service on loopback.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { Agent } from "@mastra/core/agent";
import { createTool } from "@mastra/core/tools";
import { z } from "zod";

import { deriveKey, withScope } from "../index.js";
import { idempotentTool } from "../mastra.js";
import { chargeService, gate, inspect, tmp } from "./helpers.mjs";

const ARGS = { customer: "cus_mastra", amount_cents: 4900 };
const usage = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };

/**
 * A LanguageModelV2 that answers each call with `step(prompt)`'s parts: a tool call, or text.
 * Mastra's agent streams, so doStream is what it calls.
 */
function scriptedModel(step) {
  const prompts = [];
  const answer = async (prompt) => {
    prompts.push(prompt);
    return step(prompt, prompts.length);
  };
  const finish = (content) => (content.some((p) => p.type === "tool-call") ? "tool-calls" : "stop");
  return {
    specificationVersion: "v2",
    provider: "scripted",
    modelId: "scripted",
    supportedUrls: {},
    prompts,
    async doGenerate({ prompt }) {
      const content = await answer(prompt);
      return { content, finishReason: finish(content), usage, warnings: [] };
    },
    async doStream({ prompt }) {
      const content = await answer(prompt);
      const parts = [{ type: "stream-start", warnings: [] }];
      for (const p of content) {
        if (p.type === "text") parts.push({ type: "text-start", id: "t" }, { type: "text-delta", id: "t", delta: p.text }, { type: "text-end", id: "t" });
        else parts.push(p);
      }
      parts.push({ type: "finish", finishReason: finish(content), usage });
      return { stream: new ReadableStream({ start: (c) => (parts.forEach((p) => c.enqueue(p)), c.close()) }) };
    },
  };
}

const toolResults = (prompt) => prompt.filter((m) => m.role === "tool").flatMap((m) => m.content);
const callCharge = (n) => [{ type: "tool-call", toolCallId: `call_${n}`, toolName: "charge_card", input: JSON.stringify(ARGS) }];

/** Calls charge_card; after a lost result (an error) calls it again; then says what it read. */
function recallingModel() {
  return scriptedModel((prompt, n) => {
    const results = toolResults(prompt);
    if (results.length === 0) return callCharge(n);
    const last = JSON.stringify(results.at(-1).output);
    if (/timed out/.test(last) && results.length === 1) return callCharge(n);
    return [{ type: "text", text: `read: ${last}` }];
  });
}

function chargeConfig(service) {
  return {
    id: "charge_card",
    description: "Charges a card",
    inputSchema: z.object({ customer: z.string(), amount_cents: z.number() }),
    execute: async ({ context }) => service.charge(context),
  };
}

/** The result is lost once after the effect, outside idem's layer (where a timeout would fire). */
function loseFirstResult(t) {
  let lost = false;
  const execute = t.execute;
  return createTool({
    id: t.id,
    description: t.description,
    inputSchema: t.inputSchema,
    execute: async (...a) => {
      const result = await execute(...a);
      if (lost) return result;
      lost = true;
      throw new Error("timed out waiting for charge_card's result");
    },
  });
}

async function run(tool, options = {}) {
  const model = recallingModel();
  const agent = new Agent({ name: "billing", instructions: "charge cards", model, tools: { charge_card: tool } });
  const result = await agent.generate("charge cus_mastra 49 euros", { maxSteps: 5, ...options });
  return { result, model };
}

test("a lost result and the model's re-call in one run charge once; the run id is the scope", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const { result } = await run(loseFirstResult(idempotentTool({ ...chargeConfig(service), idem: { store } })), { runId: "run-mastra-1" });
  assert.equal(service.charges.length, 1, "one charge");
  assert.match(result.text, /ch_1/);
  assert.match(inspect(deriveKey("run-mastra-1", "charge_card", ARGS), store), /replays\W+1/);
});

test("without idem the same script charges twice (the test can fail)", async (t) => {
  const service = await chargeService(t);
  await run(loseFirstResult(createTool(chargeConfig(service))));
  assert.equal(service.charges.length, 2);
});

test("a turn re-sent in the same memory thread replays (the thread id is the scope, before the run's)", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const tool = idempotentTool({ ...chargeConfig(service), idem: { store } });
  // No Memory configured: the thread id still reaches the tool from the deprecated threadId option.
  await run(tool, { threadId: "thread-mastra-1", resourceId: "user-1" });
  await run(tool, { threadId: "thread-mastra-1", resourceId: "user-1" });
  assert.equal(service.charges.length, 1);
});

test("a duplicate in flight reaches the model as a result saying do not retry yet", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const { hold, inside, release } = gate();
  const config = chargeConfig(service);
  const slow = idempotentTool({
    ...config,
    execute: async (c) => {
      await hold();
      return config.execute(c);
    },
    idem: { store, wait: null, scope: "order-77" },
  });
  const first = run(slow);
  await inside;
  const { result } = await run(slow);
  assert.match(result.text, /already in progress.*do not retry yet/);
  release();
  await first;
  assert.equal(service.charges.length, 1);
});

test("a refusal no model can fix (a bad store URL) is logged at error level; nothing charged", async (t) => {
  const service = await chargeService(t);
  const logged = [];
  const tool = idempotentTool({ ...chargeConfig(service), idem: { store: "sqlte:idem.db", logger: { error: (m) => logged.push(m) } } });
  await withScope("order-1", () => run(tool));
  assert.equal(service.charges.length, 0);
  assert.match(logged.join("\n"), /charge_card was not run: idem is not configured/);
});
