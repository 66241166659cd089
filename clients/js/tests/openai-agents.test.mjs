// The OpenAI Agents JS SDK with a scripted model (no LLM): the agent calls add_row, the model
// call that would carry its result fails (the result is lost with it, and the run throws), the
// application runs the turn again, the model calls add_row again with a new call id, and the
// row is added once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { Agent, Runner, Usage, setTracingDisabled, tool } from "@openai/agents";
import { z } from "zod";

import { deriveKey } from "../index.js";
import { idempotentTool } from "../openai-agents.js";
import { inspect, rows, tmp } from "./helpers.mjs";

setTracingDisabled(true);

/** A model that calls add_row, fails once when handed its result, and answers after a re-call. */
class ScriptedModel {
  calls = 0;
  failed = false;
  async getResponse(request) {
    this.calls++;
    const last = Array.isArray(request.input) ? request.input.at(-1) : undefined;
    if (last?.type === "function_call_result") {
      if (!this.failed) {
        this.failed = true;
        throw new Error("connection reset: the tool's result never reached the model");
      }
      return {
        usage: new Usage(),
        output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "added" }] }],
      };
    }
    return {
      usage: new Usage(),
      output: [{ type: "function_call", callId: `call_${this.calls}`, name: "add_row", arguments: JSON.stringify({ customer: "cus_agents" }), status: "completed" }],
    };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse() {
    throw new Error("not scripted");
  }
}

async function turn(file, make) {
  const effects = rows(file);
  const addRow = make({
    name: "add_row",
    description: "Adds a row for a customer",
    parameters: z.object({ customer: z.string() }),
    execute: async ({ customer }) => {
      effects.add(customer);
      return `added ${customer}`;
    },
  });
  const model = new ScriptedModel();
  const agent = new Agent({ name: "clerk", instructions: "add rows", model, tools: [addRow] });
  const runner = new Runner({ tracingDisabled: true });
  const context = { runId: "run-agents-1" };
  await assert.rejects(runner.run(agent, "add a row for cus_agents", { context }), /connection reset/);
  const result = await runner.run(agent, "add a row for cus_agents", { context });
  return { result, model, count: effects.count() };
}

test("a lost tool result and the model's re-call in a re-run turn add one row", async (t) => {
  const file = join(tmp(t), "shared.db");
  const store = `sqlite:${file}`;
  const { result, model, count } = await turn(file, (options) =>
    idempotentTool({ ...options, idem: { store, scope: (_input, runContext) => runContext.context.runId } }),
  );
  assert.equal(result.finalOutput, "added");
  assert.equal(model.calls, 4, "call, failure, re-call, answer");
  assert.equal(count, 1, "exactly one row");
  assert.match(inspect(deriveKey("run-agents-1", "add_row", { customer: "cus_agents" }), store), /completed/);
});

test("without idempotency the same script adds two rows (the test can fail)", async (t) => {
  const { count } = await turn(join(tmp(t), "shared.db"), (options) => tool(options));
  assert.equal(count, 2);
});
