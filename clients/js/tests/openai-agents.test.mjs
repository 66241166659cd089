// The OpenAI Agents JS SDK with a scripted model (no LLM): the agent calls add_row, the model
// call that would carry its result fails (the result is lost with it, and the run throws), the
// application runs the turn again, the model calls add_row again with a new call id, and the
// row is added once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { Agent, Runner, Usage, setTracingDisabled, tool } from "@openai/agents";
import { z } from "zod";

import { ScopeMissingError, deriveKey } from "../index.js";
import { idempotentTool } from "../openai-agents.js";
import { gate, inspect, rows, tmp } from "./helpers.mjs";

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

/** Calls add_row once, then answers with the tool's output as it read it. */
class OnceModel {
  async getResponse(request) {
    const last = Array.isArray(request.input) ? request.input.at(-1) : undefined;
    if (last?.type === "function_call_result") {
      const text = typeof last.output === "string" ? last.output : JSON.stringify(last.output);
      return { usage: new Usage(), output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text }] }] };
    }
    return {
      usage: new Usage(),
      output: [{ type: "function_call", callId: "call_once", name: "add_row", arguments: JSON.stringify({ customer: "cus_agents" }), status: "completed" }],
    };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse() {
    throw new Error("not scripted");
  }
}

test("no scope fails the run (not a tool error the model reads) and is logged at error level", async (t) => {
  const file = join(tmp(t), "shared.db");
  const effects = rows(file);
  const logged = [];
  const addRow = idempotentTool({
    name: "add_row",
    description: "Adds a row",
    parameters: z.object({ customer: z.string() }),
    execute: async ({ customer }) => (effects.add(customer), "ok"),
    idem: { store: `sqlite:${file}`, logger: { error: (m) => logged.push(m) } },
  });
  const agent = new Agent({ name: "clerk", instructions: "add rows", model: new OnceModel(), tools: [addRow] });
  await assert.rejects(new Runner({ tracingDisabled: true }).run(agent, "add a row"), (e) => e.error instanceof ScopeMissingError);
  assert.equal(effects.count(), 0);
  assert.match(logged.join("\n"), /add_row was not run: idem is not configured/);
});

test("a duplicate in flight is the tool's output, saying do not retry yet; the tool's own errors keep the SDK's answer", async (t) => {
  const file = join(tmp(t), "shared.db");
  const effects = rows(file);
  const { hold, inside, release } = gate();
  const addRow = idempotentTool({
    name: "add_row",
    description: "Adds a row",
    parameters: z.object({ customer: z.string() }),
    execute: async ({ customer }) => {
      await hold();
      effects.add(customer);
      return "ok";
    },
    idem: { store: `sqlite:${file}`, wait: null, scope: "order-busy" },
  });
  const agent = new Agent({ name: "clerk", instructions: "add rows", model: new OnceModel(), tools: [addRow] });
  const runner = new Runner({ tracingDisabled: true });
  const first = runner.run(agent, "add a row");
  await inside;
  const second = await runner.run(agent, "add a row");
  assert.match(second.finalOutput, /already in progress.*do not retry yet/);
  release();
  await first;
  assert.equal(effects.count(), 1);

  const failing = idempotentTool({
    name: "add_row",
    description: "Adds a row",
    parameters: z.object({ customer: z.string() }),
    execute: async () => {
      throw new Error("card declined");
    },
    idem: { store: `sqlite:${file}`, scope: "order-failing" },
  });
  const answered = await runner.run(new Agent({ name: "clerk", instructions: "x", model: new OnceModel(), tools: [failing] }), "add a row");
  assert.match(answered.finalOutput, /An error occurred while running the tool\. Please try again\./);
});
