// The Vercel AI SDK (`ai`): withIdempotency(tool({...}), { tool: "name", scope }) makes a tool's
// execute retry-safe. The scope comes from the caller (an option, a function of the execute
// call, or withScope), never from the toolCallId alone: a model asked again calls with a new id.
import { idempotent } from "./idempotent.js";

function wrapOne(t, name, options) {
  if (typeof t?.execute !== "function") {
    throw new TypeError(`withIdempotency: tool ${name ?? ""} has no execute function (a client-side tool cannot be made idempotent here)`);
  }
  return { ...t, execute: idempotent(t.execute, { ...options, tool: name }) };
}

/**
 * Wraps one AI SDK tool (`options.tool` names it, as in your `tools` object) or a whole
 * `tools` object (each named by its key). Other options are idempotent()'s.
 */
export function withIdempotency(toolOrTools, options = {}) {
  if (typeof toolOrTools?.execute === "function") {
    if (!options.tool) throw new TypeError("withIdempotency(tool, { tool: 'name' }): name the tool as in your tools object");
    return wrapOne(toolOrTools, options.tool, options);
  }
  return Object.fromEntries(Object.entries(toolOrTools).map(([name, t]) => [name, wrapOne(t, name, options)]));
}
