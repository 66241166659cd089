// The Vercel AI SDK (`ai`): withIdempotency(tool({...}), { tool: "name", scope }) makes a tool's
// execute retry-safe. The scope comes from the caller (an option, a function of the execute
// call, or withScope), never from the toolCallId alone: a model asked again calls with a new id.
// An `idempotency_key` the model writes is neither the key nor the intent (idempotent() leaves
// it out and hands execute the derived key), as in the LangChain and Mastra adapters.
//
// The AI SDK hands every error a tool's execute throws to the model as a `tool-error` result and
// goes on; nothing fails the run. So idem's refusals that no model can fix (no scope, a bad store
// URL or option, arguments with no key, the store down) are logged at error level (`logger`,
// default console) besides; an answer the model can act on (a duplicate in flight, an unknown
// outcome) is a tool-error whose text says what to do ("already in progress, do not retry yet").
import { idempotent } from "./idempotent.js";
import { adapterLogger, forModel } from "./refusal.js";

function wrapOne(t, name, options, logger) {
  if (typeof t?.execute !== "function") {
    throw new TypeError(`withIdempotency: tool ${name ?? ""} has no execute function (a client-side tool cannot be made idempotent here)`);
  }
  const keyed = idempotent(t.execute, { ...options, tool: name });
  const execute = async (...a) => {
    try {
      return await keyed(...a);
    } catch (e) {
      throw forModel(name, e, logger);
    }
  };
  return { ...t, execute };
}

/**
 * Wraps one AI SDK tool (`options.tool` names it, as in your `tools` object) or a whole
 * `tools` object (each named by its key). Other options are idempotent()'s, and `logger`.
 */
export function withIdempotency(toolOrTools, options = {}) {
  const { logger: given, ...rest } = options;
  const logger = adapterLogger(given);
  if (typeof toolOrTools?.execute === "function") {
    if (!rest.tool) throw new TypeError("withIdempotency(tool, { tool: 'name' }): name the tool as in your tools object");
    return wrapOne(toolOrTools, rest.tool, rest, logger);
  }
  return Object.fromEntries(Object.entries(toolOrTools).map(([name, t]) => [name, wrapOne(t, name, rest, logger)]));
}
