// The OpenAI Agents JS SDK (`@openai/agents`): idempotentTool({ name, parameters, execute, idem })
// is tool() with a retry-safe execute. The scope comes from `idem.scope` (e.g.
// `(input, runContext) => runContext.context.runId`) or withScope.
//
// The SDK hands a tool's error to the model through the tool's `errorFunction` (by default a
// fixed "An error occurred while running the tool. Please try again."). idem's refusals go
// another way: one no model can fix (no scope, a bad store URL or option, arguments with no key,
// the store down) fails the run (the SDK rethrows what an errorFunction throws) and is logged at
// error level; an answer the model can act on (a duplicate in flight, an unknown outcome) is the
// tool's output, saying what to do. Every other error goes to your errorFunction (or the SDK's).
import { tool } from "@openai/agents";

import { idempotent } from "./idempotent.js";
import { adapterLogger, refusal } from "./refusal.js";

/** The SDK's default answer for a tool's own error (not exported by @openai/agents 0.20). */
const SDK_DEFAULT_ERROR = "An error occurred while running the tool. Please try again.";

/**
 * As `tool(options)`; `options.idem` holds idempotent()'s options (the tool name is
 * `options.name`) and `logger` (default console).
 */
export function idempotentTool(options) {
  const { idem = {}, execute, errorFunction, ...rest } = options;
  if (typeof execute !== "function") throw new TypeError("idempotentTool needs execute");
  if (!rest.name) throw new TypeError("idempotentTool needs a name: it is part of every key");
  const { logger: given, ...idemOptions } = idem;
  const logger = adapterLogger(given);
  // As the SDK: no errorFunction given means its default, or none (rethrow) with an outputSchema.
  const own = errorFunction === undefined ? (rest.outputSchema === undefined ? () => SDK_DEFAULT_ERROR : null) : errorFunction;
  return tool({
    ...rest,
    execute: idempotent(execute, { ...idemOptions, tool: rest.name }),
    errorFunction: (context, error, details) => {
      const r = refusal(rest.name, error, logger);
      if (r !== null && !r.configured) throw error; // fails the run
      if (own === null) throw error;
      if (r !== null) return r.text;
      return own(context, error, details);
    },
  });
}
