// The AI SDK with a scripted model (MockLanguageModelV3 from ai/test, no LLM): the model calls
// add_row, the tool's result is lost on its way back once (a timeout firing after the effect,
// so the model sees an error), the model calls it again with a new toolCallId, and the row is
// added once. The rows and idem's records share one SQLite file, read by `idem inspect`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";

import { deriveKey, withScope } from "../index.js";
import { withIdempotency } from "../ai.js";
import { gate, inspect, rows, tmp } from "./helpers.mjs";

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** Calls add_row, calls it again (new id) after a tool error, then answers. */
function scriptedModel() {
  let turn = 0;
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      turn++;
      const last = prompt.at(-1);
      const failed = last?.role === "tool" && last.content.some((p) => p.output?.type === "error-text");
      if (turn === 1 || failed) {
        return {
          content: [{ type: "tool-call", toolCallId: `call_${turn}`, toolName: "add_row", input: JSON.stringify({ customer: "cus_ai" }) }],
          finishReason: { unified: "tool-calls", raw: undefined },
          usage,
          warnings: [],
        };
      }
      return { content: [{ type: "text", text: "added" }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
    },
  });
}

/** The tool's result is lost once after the effect (outside idem's layer, where a timeout would fire). */
function loseFirstResult(t) {
  let lost = false;
  return {
    ...t,
    execute: async (...a) => {
      const result = await t.execute(...a);
      if (!lost) {
        lost = true;
        throw new Error("timed out waiting for the tool's result");
      }
      return result;
    },
  };
}

async function runTurn(file, wrap) {
  const effects = rows(file);
  const addRow = tool({
    description: "Adds a row for a customer",
    inputSchema: z.object({ customer: z.string() }),
    execute: async ({ customer }) => {
      effects.add(customer);
      return { added: customer };
    },
  });
  const model = scriptedModel();
  const result = await generateText({
    model,
    prompt: "add a row for cus_ai",
    tools: { add_row: loseFirstResult(wrap(addRow)) },
    stopWhen: stepCountIs(5),
  });
  return { result, model, count: effects.count() };
}

test("a lost tool result and the model's re-call add one row; idem inspect shows the record", async (t) => {
  const file = join(tmp(t), "shared.db");
  const store = `sqlite:${file}`;
  const { result, model, count } = await withScope("run-ai-1", () =>
    runTurn(file, (addRow) => withIdempotency(addRow, { tool: "add_row", store })),
  );
  assert.equal(model.doGenerateCalls.length, 3, "call, re-call, answer");
  assert.equal(result.text, "added");
  assert.equal(count, 1, "exactly one row");
  const shown = inspect(deriveKey("run-ai-1", "add_row", { customer: "cus_ai" }), store);
  assert.match(shown, /completed/);
  assert.match(shown, /replays\W+1/);
});

test("without idempotency the same script adds two rows (the test can fail)", async (t) => {
  const file = join(tmp(t), "shared.db");
  const { count } = await runTurn(file, (addRow) => addRow);
  assert.equal(count, 2);
});

test("a tools object is wrapped whole, and the scope may come from experimental_context", async (t) => {
  const file = join(tmp(t), "shared.db");
  const store = `sqlite:${file}`;
  const effects = rows(file);
  const tools = withIdempotency(
    { add_row: tool({ inputSchema: z.object({ customer: z.string() }), execute: async ({ customer }) => (effects.add(customer), "ok") }) },
    { store, scope: (_input, { experimental_context }) => experimental_context.runId },
  );
  const run = () =>
    generateText({ model: scriptedModel(), prompt: "x", tools, stopWhen: stepCountIs(5), experimental_context: { runId: "run-ai-ctx" } });
  await run();
  await run(); // a human re-sends the whole turn: same run, same intent
  assert.equal(effects.count(), 1);
});

/** Calls add_row once, then answers with what it read. */
function onceModel() {
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      const last = prompt.at(-1);
      if (last?.role !== "tool") {
        return {
          content: [{ type: "tool-call", toolCallId: "call_once", toolName: "add_row", input: JSON.stringify({ customer: "cus_ai" }) }],
          finishReason: { unified: "tool-calls", raw: undefined },
          usage,
          warnings: [],
        };
      }
      return { content: [{ type: "text", text: JSON.stringify(last.content[0].output) }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
    },
  });
}

test("no scope: the AI SDK hands the error to the model and goes on, so idem logs it at error level; nothing ran", async (t) => {
  const file = join(tmp(t), "shared.db");
  const effects = rows(file);
  const logged = [];
  const tools = withIdempotency(
    { add_row: tool({ inputSchema: z.object({ customer: z.string() }), execute: async ({ customer }) => (effects.add(customer), "ok") }) },
    { store: `sqlite:${file}`, logger: { error: (m) => logged.push(m) } },
  );
  const result = await generateText({ model: onceModel(), prompt: "x", tools, stopWhen: stepCountIs(3) });
  assert.equal(effects.count(), 0);
  assert.match(result.text, /error-text/);
  assert.match(logged.join("\n"), /add_row was not run: idem is not configured for it: no scope/);
});

test("a duplicate in flight reaches the model as a tool error saying do not retry yet", async (t) => {
  const file = join(tmp(t), "shared.db");
  const effects = rows(file);
  const { hold, inside, release } = gate();
  const tools = withIdempotency(
    {
      add_row: tool({
        inputSchema: z.object({ customer: z.string() }),
        execute: async ({ customer }) => {
          await hold();
          effects.add(customer);
          return "ok";
        },
      }),
    },
    { store: `sqlite:${file}`, wait: null },
  );
  const run = () => withScope("run-ai-busy", () => generateText({ model: onceModel(), prompt: "x", tools, stopWhen: stepCountIs(3) }));
  const first = run();
  await inside;
  const second = await run();
  assert.match(second.text, /already in progress.*do not retry yet/);
  release();
  await first;
  assert.equal(effects.count(), 1);
});

test("an unknown outcome reaches the model as a tool error saying do not call it again", async (t) => {
  const file = join(tmp(t), "shared.db");
  const effects = rows(file);
  let turn = 0;
  const model = new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      turn++;
      if (turn <= 2) {
        return {
          content: [{ type: "tool-call", toolCallId: `call_${turn}`, toolName: "add_row", input: JSON.stringify({ customer: "cus_ai" }) }],
          finishReason: { unified: "tool-calls", raw: undefined },
          usage,
          warnings: [],
        };
      }
      return { content: [{ type: "text", text: JSON.stringify(prompt.at(-1).content[0].output) }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
    },
  });
  // The row is added, but the result cannot be stored (a BigInt is not JSON): the outcome is unknown.
  const tools = withIdempotency(
    { add_row: tool({ inputSchema: z.object({ customer: z.string() }), execute: async ({ customer }) => (effects.add(customer), { n: 1n }) }) },
    { store: `sqlite:${file}` },
  );
  const result = await withScope("run-ai-unknown", () => generateText({ model, prompt: "x", tools, stopWhen: stepCountIs(4) }));
  assert.equal(effects.count(), 1);
  assert.match(result.text, /outcome is unknown; do not call it again: an operator must check/);
});
