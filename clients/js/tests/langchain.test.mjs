// LangChain.js v1 (`createAgent` with idem's wrapToolCall middleware) and LangGraph.js (a graph of
// our own whose tools run in the prebuilt ToolNode), each with LangChain's own scripted chat model
// (`fakeModel` from @langchain/core/testing: no LLM). charge_card charges through a payment
// service on loopback, so a charge is a real request counted there.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFileSync, rmSync } from "node:fs";
import { join } from "node:path";

import { AIMessage, ToolMessage, createAgent, createMiddleware, tool } from "langchain";
import { fakeModel } from "@langchain/core/testing";
import { END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { z } from "zod";

import { ScopeMissingError, deriveKey } from "../index.js";
import { idempotencyMiddleware, idempotentTools } from "../langchain.js";
import { chargeService, gate, inspect, pkg, repo, tmp } from "./helpers.mjs";

const ARGS = { customer: "cus_lc", amount_cents: 4900 };

function chargeTool(service, gate) {
  return tool(
    async (args) => {
      await gate?.();
      const charge = await service.charge(args);
      return JSON.stringify(charge);
    },
    { name: "charge_card", description: "Charges a card", schema: z.object({ customer: z.string(), amount_cents: z.number() }) },
  );
}

/** Loses the first answer of the tool on its way back (a timeout firing after the effect). */
function lossy() {
  let lost = false;
  return createMiddleware({
    name: "Lossy",
    wrapToolCall: async (request, handler) => {
      const answer = await handler(request);
      if (lost) return answer;
      lost = true;
      return new ToolMessage({ content: "timed out waiting for charge_card's result", status: "error", tool_call_id: request.toolCall.id, name: "charge_card" });
    },
  });
}

/** Calls charge_card, calls it again (a new tool-call id) after the lost answer, then answers. */
function recallingModel() {
  return fakeModel()
    .respondWithTools([{ name: "charge_card", args: ARGS, id: "call_1" }])
    .respondWithTools([{ name: "charge_card", args: ARGS, id: "call_2" }])
    .respond(new AIMessage("charged"));
}

const toolMessages = (result) => result.messages.filter((m) => ToolMessage.isInstance(m));

test("createAgent: a lost answer and the model's re-call charge once; the replay is marked in response_metadata", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const agent = createAgent({
    model: recallingModel(),
    tools: [chargeTool(service)],
    middleware: [lossy(), idempotencyMiddleware({ tools: ["charge_card"], store })],
    checkpointer: new MemorySaver(),
  });
  const result = await agent.invoke({ messages: [{ role: "user", content: "charge cus_lc 49 euros" }] }, { configurable: { thread_id: "thread-lc-1" } });
  assert.equal(service.charges.length, 1, "one charge");
  const [lost, replayed] = toolMessages(result);
  assert.equal(lost.status, "error");
  assert.equal(replayed.tool_call_id, "call_2");
  assert.deepEqual(replayed.response_metadata.idem, { key: deriveKey("thread-lc-1", "charge_card", ARGS), replayed: true });
  assert.equal(JSON.parse(replayed.content).id, "ch_1");
  assert.equal(result.messages.at(-1).content, "charged");
  assert.match(inspect(deriveKey("thread-lc-1", "charge_card", ARGS), store), /completed/);
});

test("createAgent without idem: the same script charges twice (the test can fail)", async (t) => {
  const service = await chargeService(t);
  const agent = createAgent({ model: recallingModel(), tools: [chargeTool(service)], middleware: [lossy()], checkpointer: new MemorySaver() });
  await agent.invoke({ messages: [{ role: "user", content: "charge" }] }, { configurable: { thread_id: "thread-lc-2" } });
  assert.equal(service.charges.length, 2);
});

/** Runs one turn with idem configured by `options`, which must refuse: what was logged, and the charges. */
async function refused(t, options, config) {
  const service = await chargeService(t);
  const logged = [];
  const idem = idempotencyMiddleware({ tools: ["charge_card"], ...options, logger: { error: (m) => logged.push(m) } });
  const agent = createAgent({ model: recallingModel(), tools: [chargeTool(service)], middleware: [idem] });
  const failure = await agent.invoke({ messages: [{ role: "user", content: "charge" }] }, config).then(
    () => assert.fail("the run went on"),
    (e) => e,
  );
  return { failure, logged: logged.join("\n"), charges: service.charges.length };
}

test("createAgent: no scope (no thread id, no withScope) fails the run, is logged at error level, and charges nothing", async (t) => {
  const { failure, logged, charges } = await refused(t, { store: "memory:" });
  assert.ok(failure instanceof ScopeMissingError || failure.cause instanceof ScopeMissingError, String(failure));
  assert.equal(charges, 0);
  assert.match(logged, /charge_card was not run: idem is not configured/);
});

test("createAgent: a bad store URL fails the run, logged", async (t) => {
  const { failure, logged, charges } = await refused(t, { store: "sqlte:idem.db" }, { configurable: { thread_id: "t" } });
  assert.match(String(failure), /unknown scheme "sqlte"/);
  assert.equal(charges, 0);
  assert.match(logged, /idem is not configured/);
});

test("createAgent: a duplicate in flight reaches the model as an error ToolMessage saying not to retry yet", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const { hold, inside, release } = gate();
  const slow = chargeTool(service, hold);
  const idem = idempotencyMiddleware({ tools: ["charge_card"], store, wait: null });
  const config = { configurable: { thread_id: "thread-lc-busy" } };
  const first = createAgent({ model: fakeModel().respondWithTools([{ name: "charge_card", args: ARGS, id: "a" }]).respond(new AIMessage("done")), tools: [slow], middleware: [idem] });
  const running = first.invoke({ messages: [{ role: "user", content: "charge" }] }, config);
  await inside;
  const second = createAgent({ model: fakeModel().respondWithTools([{ name: "charge_card", args: ARGS, id: "b" }]).respond(new AIMessage("waiting")), tools: [slow], middleware: [idem] });
  const busy = await second.invoke({ messages: [{ role: "user", content: "charge" }] }, config);
  const [answer] = toolMessages(busy);
  assert.equal(answer.status, "error");
  assert.match(answer.content, /already in progress.*do not retry yet/);
  assert.equal(answer.response_metadata.idem.refused, "in_flight");
  release();
  await running;
  assert.equal(service.charges.length, 1);
});

/** A graph of our own: the model, then LangGraph's prebuilt ToolNode, in a loop. */
function graph(model, tools) {
  const bound = model.bindTools(tools);
  return new StateGraph(MessagesAnnotation)
    .addNode("agent", async (state) => ({ messages: [await bound.invoke(state.messages)] }))
    .addNode("tools", new ToolNode(tools))
    .addEdge(START, "agent")
    .addConditionalEdges("agent", (state) => (state.messages.at(-1).tool_calls?.length ? "tools" : END))
    .addEdge("tools", "agent")
    .compile({ checkpointer: new MemorySaver() });
}

/** Charges, then the model call that would read the result fails; the human sends it again. */
async function resent(service, wrap) {
  const model = fakeModel()
    .respondWithTools([{ name: "charge_card", args: ARGS, id: "call_1" }])
    .respond(new Error("connection reset: the answer never reached the user"))
    .respondWithTools([{ name: "charge_card", args: ARGS, id: "call_2" }])
    .respond(new AIMessage("charged"));
  const app = graph(model, wrap([chargeTool(service)]));
  const config = { configurable: { thread_id: "thread-lg-1" } };
  await assert.rejects(app.invoke({ messages: [{ role: "user", content: "charge cus_lc 49 euros" }] }, config), /connection reset/);
  return app.invoke({ messages: [{ role: "user", content: "charge cus_lc 49 euros" }] }, config);
}

test("LangGraph ToolNode: the run fails after the charge, the human re-sends in the thread: one charge", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const result = await resent(service, (tools) => idempotentTools(tools, { store }));
  assert.equal(service.charges.length, 1);
  const replayed = toolMessages(result).at(-1);
  assert.equal(replayed.tool_call_id, "call_2");
  assert.equal(replayed.response_metadata.idem.replayed, true);
  assert.equal(JSON.parse(replayed.content).id, "ch_1");
});

test("LangGraph ToolNode without idem: two charges (the test can fail)", async (t) => {
  const service = await chargeService(t);
  await resent(service, (tools) => tools);
  assert.equal(service.charges.length, 2);
});

test("LangGraph ToolNode: no scope is logged at error level (the ToolNode turns errors into text) and charges nothing", async (t) => {
  const service = await chargeService(t);
  const logged = [];
  const model = fakeModel().respondWithTools([{ name: "charge_card", args: ARGS, id: "c" }]).respond(new AIMessage("?"));
  const [wrapped] = idempotentTools([chargeTool(service)], { store: "memory:", logger: { error: (m) => logged.push(m) } });
  const app = new StateGraph(MessagesAnnotation)
    .addNode("agent", async (state) => ({ messages: [await model.bindTools([wrapped]).invoke(state.messages)] }))
    .addNode("tools", new ToolNode([wrapped]))
    .addEdge(START, "agent")
    .addConditionalEdges("agent", (state) => (state.messages.at(-1).tool_calls?.length ? "tools" : END))
    .addEdge("tools", "agent")
    .compile();
  const result = await app.invoke({ messages: [{ role: "user", content: "charge" }] });
  assert.equal(service.charges.length, 0);
  assert.match(toolMessages(result)[0].content, /no scope/);
  assert.match(logged.join("\n"), /not configured/);
  // With handleToolErrors: false the ToolNode lets it fail the run.
  const strict = new ToolNode([wrapped], { handleToolErrors: false });
  await assert.rejects(strict.invoke({ messages: [new AIMessage({ content: "", tool_calls: [{ name: "charge_card", args: ARGS, id: "d" }] })] }), ScopeMissingError);
});

test("a misspelt option is refused when the middleware is built, not at the first charge", () => {
  assert.throws(() => idempotencyMiddleware({ tools: ["charge_card"], retries: 3 }), /unknown option retries/);
  assert.throws(() => idempotentTools([{ name: "charge_card", invoke: async () => "" }], { lease: -1 }), /lease/);
  assert.throws(() => idempotencyMiddleware({ tools: [] }), /names \(or tools\) of the tools with side effects/);
});

test("tools from idempotentTools under the middleware too are keyed once (not a duplicate of themselves)", async (t) => {
  const service = await chargeService(t);
  const store = `sqlite:${join(tmp(t), "idem.db")}`;
  const agent = createAgent({
    model: recallingModel(),
    tools: idempotentTools([chargeTool(service)], { store }),
    middleware: [lossy(), idempotencyMiddleware({ tools: ["charge_card"], store, wait: 2000 })],
    checkpointer: new MemorySaver(),
  });
  const result = await agent.invoke({ messages: [{ role: "user", content: "charge" }] }, { configurable: { thread_id: "thread-lc-both" } });
  assert.equal(service.charges.length, 1);
  assert.equal(toolMessages(result).at(-1).response_metadata.idem.replayed, true);
});

test("examples/agents/langchain_charge.mjs, the README's example, runs: 1 charge for 2 tool attempts", () => {
  // Beside the package, so that its imports resolve as in a user's project (idem-runtime by name).
  const example = join(pkg, ".langchain_charge.example.mjs");
  copyFileSync(join(repo, "examples", "agents", "langchain_charge.mjs"), example);
  try {
    assert.match(execFileSync(process.execPath, [example], { encoding: "utf8" }), /^1 charge for 2 tool attempts/);
  } finally {
    rmSync(example, { force: true });
  }
});
