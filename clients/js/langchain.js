// LangChain.js v1 agents (`createAgent` with `createMiddleware({ wrapToolCall })`) and LangGraph.js
// graphs (tools run by `ToolNode` from @langchain/langgraph/prebuilt): the named tools run at most
// once per intent.
//
//     const idem = idempotencyMiddleware({ tools: ["charge_card"], store: "sqlite:idem.db" });
//     const agent = createAgent({ model, tools, middleware: [idem], checkpointer: new MemorySaver() });
//     await agent.invoke({ messages }, { configurable: { thread_id: "order-7" } });
//     // a graph of your own: new ToolNode([...idempotentTools([chargeCard], options), lookup])
//
// Each named tool gets one idempotent() function (the engine's claim, completion and replay;
// nothing here decides what runs). Its key is derived from the scope, the tool's name and the
// tool call's arguments (less an `idempotency_key` the model wrote: it invents a new one on each
// try), so a call repeated by toolRetryMiddleware, by the model asking again after a lost result,
// or by the graph resuming from its checkpoint in another process gets the stored ToolMessage
// back instead of acting twice. The tool runs inside withScope(<its scope>).
//
// The scope is the LangGraph **thread id** (`config.configurable.thread_id`): the one id that
// survives all three of those. A tool-call id is new each time the model asks; LangChain's run
// id (`config.runId`) is new on every `invoke`, so a resume after a crash, or a turn re-sent,
// would act again under either. Put the retries and resumes of one piece of work in one thread.
// Within a thread the same tool with the same arguments is one intent for the retention period;
// if a conversation may deliberately repeat a call, pass `scope` a function of the tool call (an
// order id from its arguments, a per-turn id from the run's context) or key on fields that differ.
//
// A tool's own error releases the key (the retry runs) and goes on up the chain as it came, as
// LangChain expects of a wrapToolCall middleware: toolRetryMiddleware retries it,
// toolErrorMiddleware turns it into a message; with neither, LangChain's ToolNode ends the run
// with it, as it does under any wrapToolCall middleware. An error ToolMessage the tool answers
// with is not stored either (released), and a Command cannot be replayed (outcome unknown).
//
// Refusals (refusal.js): an answer the model can act on (a duplicate in flight, an unknown
// outcome, a key used with other arguments) is an error ToolMessage saying what to do. One no
// model can fix (no scope, a bad store URL or option, arguments with no key, the store down) is
// logged at error level and thrown: LangChain's ToolNode lets an error thrown by a wrapToolCall
// middleware end the run (MiddlewareError); LangGraph's prebuilt ToolNode turns a tool's error
// into text unless built with `handleToolErrors: false`, so there the error log is what shows it
// (as with toolRetryMiddleware's default `onFailure: "continue"`, which answers with a message).
import { ToolMessage } from "@langchain/core/messages";

import { ConfigurationError, IdemError, ScopeMissingError } from "./errors.js";
import { idempotent, jsonCodec } from "./idempotent.js";
import { adapterLogger, forModel, refusal } from "./refusal.js";
import { Scope, currentScope } from "./scope.js";
import { deriveKey } from "./index.js";

const KEY_ARGUMENT = "idempotency_key";

let createMiddleware;
try {
  ({ createMiddleware } = await import("langchain"));
} catch {
  // LangGraph alone: idempotentTools works; idempotencyMiddleware says what is missing.
}

/** The arguments a key is derived from: the model's, less any idempotency_key it wrote. */
function modelArguments(args) {
  const { [KEY_ARGUMENT]: _written, ...rest } = args ?? {};
  return rest;
}

/** The scope LangGraph offers a tool call: the thread id of the run's config, else undefined. */
export function threadScope(runtime) {
  const id = runtime?.configurable?.thread_id;
  return id === undefined || id === null || id === "" ? undefined : String(id);
}

/** Marks the tools idempotentTools made: the middleware passes them through, keyed once. */
const KEYED = Symbol("idem-runtime keyed tool");

const isCommand = (x) => x !== null && typeof x === "object" && x.lg_name === "Command";

/** The tool ran, but its answer is not a result to replay (an error ToolMessage): released. */
class NotStored extends Error {
  constructor(answer) {
    super("the tool answered with an error message: not stored, the key is released");
    this.answer = answer;
  }
}

/** A Command cannot be replayed: the codec refuses it, so the key is left outcome-unknown. */
const UNSTORABLE = Object.freeze({});
const codec = Object.freeze({
  mediaType: jsonCodec.mediaType,
  encode: (value) => {
    if (value === UNSTORABLE) throw new TypeError("a Command cannot be stored for replay");
    return jsonCodec.encode(value);
  },
  decode: jsonCodec.decode,
});

function payload(answer) {
  if (ToolMessage.isInstance(answer)) {
    if (answer.status === "error") throw new NotStored(answer);
    const p = { content: answer.content, status: answer.status ?? "success" };
    if (answer.artifact !== undefined) p.artifact = answer.artifact;
    return p;
  }
  return { value: answer };
}

/** What the middleware and the wrapped tools share: one idempotent() per tool name. */
function keyedTools(options, where) {
  const { tools, scope, keyFields = {}, logger: given, ...rest } = options ?? {};
  if (rest.tool !== undefined) throw new ConfigurationError(`${where}: the tool names are the tools' own (tools: [...])`);
  const logger = adapterLogger(given);
  const fns = new Map();

  function fnFor(name) {
    let fn = fns.get(name);
    if (!fn) {
      fn = idempotent(
        async (_args, call) => {
          const answer = await call.invoke();
          call.answer = answer;
          if (isCommand(answer)) return UNSTORABLE;
          return payload(answer);
        },
        { ...rest, codec, tool: name, keyFields: keyFields[name], scope: (_args, call) => call.scope },
      );
      fns.set(name, fn);
    }
    return fn;
  }

  function scopeFor(toolCall, runtime) {
    let s = typeof scope === "function" ? scope(toolCall, runtime) : scope;
    if (s === undefined || s === null || s === "") s = threadScope(runtime);
    if (s === undefined) s = currentScope();
    if (s === undefined) {
      throw new ScopeMissingError(
        `${toolCall.name}: no scope for its idempotency key. Run the agent with a checkpointer and ` +
          "config { configurable: { thread_id } }, pass scope to the idem middleware, or call it inside " +
          "withScope(runId, ...) (never a tool-call id: it changes when the model asks again)",
      );
    }
    return Scope.from(s);
  }

  /**
   * Runs `invoke` (the rest of the chain, or the tool) at most once for (scope, tool, arguments);
   * answers a ToolMessage, a Command, or (a tool invoked without a tool call) its value.
   */
  async function call(toolCall, runtime, invoke) {
    const name = toolCall.name;
    const args = modelArguments(toolCall.args);
    // Also the call options of idempotent()'s span: `toolCallId` names the call there.
    const state = { scope: undefined, answer: undefined, invoke: undefined, toolCallId: toolCall.id };
    try {
      state.scope = scopeFor(toolCall, runtime);
      // A tool that takes an idempotency_key gets the runtime's, whatever the model wrote there.
      state.invoke = () => {
        if (!(KEY_ARGUMENT in (toolCall.args ?? {}))) return invoke(toolCall);
        const key = deriveKey(state.scope.id, name, args, { ordinal: rest.ordinal, secret: rest.secret, keyFields: keyFields[name] });
        return invoke({ ...toolCall, args: { ...args, [KEY_ARGUMENT]: key } });
      };
      const { value, outcome } = await fnFor(name).callWithOutcome(args, state);
      const meta = { idem: { key: outcome.key, replayed: outcome.replayed } };
      if (!outcome.replayed) return mark(state.answer, meta);
      if ("value" in value) return value.value;
      return new ToolMessage({
        content: value.content,
        status: value.status,
        artifact: value.artifact,
        name,
        tool_call_id: toolCall.id,
        response_metadata: meta,
      });
    } catch (e) {
      if (e instanceof NotStored) return e.answer;
      if (isCommand(state.answer) && !(e instanceof IdemError)) {
        process.emitWarning(`idem: ${name} answered with a Command, which cannot be replayed (${e.message}); a repeat gets OutcomeUnknownError`);
        return state.answer;
      }
      const r = refusal(name, e, logger);
      if (r === null || !r.configured) throw e; // the tool's own error, or idem not configured
      if (toolCall.id === undefined) throw forModel(name, e, logger);
      return new ToolMessage({
        content: r.text,
        status: "error",
        name,
        tool_call_id: toolCall.id,
        response_metadata: { idem: { key: e.key, refused: r.kind } },
      });
    }
  }

  /** Builds each named tool's idempotent() now, so a bad option fails here, not at the first call. */
  function prepare(toolNames) {
    for (const name of toolNames) fnFor(name);
  }

  return { call, prepare };
}

function mark(answer, meta) {
  if (ToolMessage.isInstance(answer)) answer.response_metadata = { ...answer.response_metadata, ...meta };
  return answer;
}

function names(tools, where) {
  const list = (tools ?? []).map((t) => (typeof t === "string" ? t : t?.name));
  if (list.length === 0 || !list.every((n) => typeof n === "string" && n !== "")) {
    throw new ConfigurationError(`${where}({ tools: [...] }) needs the names (or tools) of the tools with side effects; a read-only tool should not replay old answers`);
  }
  return new Set(list);
}

/**
 * A LangChain v1 agent middleware (`createMiddleware({ wrapToolCall })`) that makes the named
 * tools at most once per intent. Options: `tools` (names or tools: those with side effects),
 * `store`, `scope` (a value, a Scope, or `(toolCall, runtime) => id`; default the thread id,
 * then withScope), `keyFields` (per tool name), `logger` (default console), and idempotent()'s
 * (`retention`, `lease`, `wait`, `keepErrors`, `secret`, ...). Every answer's
 * `response_metadata.idem` is `{ key, replayed }`. Put it last in `middleware`, nearest the tool.
 */
export function idempotencyMiddleware(options = {}) {
  if (!createMiddleware) {
    throw new ConfigurationError("idempotencyMiddleware needs the `langchain` package (v1): npm install langchain; for a LangGraph ToolNode, use idempotentTools");
  }
  const only = names(options.tools, "idempotencyMiddleware");
  const keyed = keyedTools(options, "idempotencyMiddleware");
  keyed.prepare(only);
  return createMiddleware({
    name: "IdempotencyMiddleware",
    wrapToolCall: (request, handler) => {
      // A tool idempotentTools made is keyed by its own invoke; keying it here too would make the
      // tool's claim a duplicate in flight of this one.
      if (!only.has(request.toolCall?.name) || request.tool?.[KEYED]) return handler(request);
      return keyed.call(request.toolCall, request.runtime, (toolCall) => handler(toolCall === request.toolCall ? request : { ...request, toolCall }));
    },
  });
}

/**
 * The given LangChain tools, each made at most once per intent, for a LangGraph `ToolNode`
 * (or anything that calls `tool.invoke(toolCall, config)`). Options as idempotencyMiddleware's,
 * without `tools`: pass only the tools with side effects. Each is the same tool (name, schema,
 * description), with an `invoke` that goes through idem.
 */
export function idempotentTools(tools, options = {}) {
  if (!Array.isArray(tools)) throw new ConfigurationError("idempotentTools(tools, options): tools is an array of LangChain tools");
  if (options.tools !== undefined) throw new ConfigurationError("idempotentTools: pass only the tools with side effects; `tools` is not an option here");
  const keyed = keyedTools(options, "idempotentTools");
  keyed.prepare(names(tools, "idempotentTools"));
  return tools.map((t) => {
    const wrapped = Object.create(t);
    wrapped[KEYED] = true;
    wrapped.invoke = (input, config) => {
      const isCall = input !== null && typeof input === "object" && input.type === "tool_call" && "args" in input;
      const toolCall = isCall ? input : { name: t.name, args: input, id: config?.toolCall?.id ?? config?.toolCallId };
      return keyed.call({ ...toolCall, name: t.name }, config, (call) => t.invoke(isCall ? call : call.args, config));
    };
    return wrapped;
  });
}
