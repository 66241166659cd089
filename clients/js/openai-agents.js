// The OpenAI Agents JS SDK (`@openai/agents`): idempotentTool({ name, parameters, execute, idem })
// is tool() with a retry-safe execute. The scope comes from `idem.scope` (e.g.
// `(input, runContext) => runContext.context.runId`) or withScope.
import { tool } from "@openai/agents";

import { idempotent } from "./idempotent.js";

/** As `tool(options)`; `options.idem` holds idempotent()'s options (the tool name is `options.name`). */
export function idempotentTool(options) {
  const { idem = {}, execute, ...rest } = options;
  if (typeof execute !== "function") throw new TypeError("idempotentTool needs execute");
  if (!rest.name) throw new TypeError("idempotentTool needs a name: it is part of every key");
  return tool({ ...rest, execute: idempotent(execute, { ...idem, tool: rest.name }) });
}
