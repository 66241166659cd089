// Mastra (`@mastra/core` 0.24, the last line that runs on Node.js 20; 1.x needs Node 22 and
// changed a tool's execute signature): idempotentTool({ id, description, inputSchema, execute,
// idem }) is createTool() with a retry-safe execute.
//
// The key is derived from the scope, the tool's id and the input the model gave
// (`context.context`, less an `idempotency_key` it wrote). The scope, in this order:
// `idem.scope` (a value, or a function of the tool's execution context, e.g.
// `({ runtimeContext }) => runtimeContext.get("orderId")`); the current withScope (the
// application's own choice, e.g. a scope a supervisor handed down); the memory thread
// (`threadId`, when the agent runs with memory: it survives a turn re-sent in the thread); the
// run (`runId`: Mastra makes a new one on every generate()/stream() unless you pass `runId`, so
// it covers a model asking again within one run only). Never the tool-call id alone: it is new
// each time the model asks.
//
// Mastra catches a tool's error, logs it with its own logger and hands it to the model as the
// tool's result; nothing fails the run. So idem's refusals that no model can fix (no scope, a bad
// store URL or option, arguments with no key, the store down) are logged at error level by idem
// too (`idem.logger`, default console; Mastra's `mastra.getLogger()` fits), and an answer the
// model can act on (a duplicate in flight, an unknown outcome) is an error whose message says
// what to do ("already in progress, do not retry yet").
import { createTool } from "@mastra/core/tools";

import { idempotent } from "./idempotent.js";
import { adapterLogger, forModel } from "./refusal.js";
import { currentScope } from "./scope.js";

const KEY_ARGUMENT = "idempotency_key";

/** The scope Mastra offers a tool call: the memory thread, else the run; undefined if neither. */
export function mastraScope(context) {
  for (const id of [context?.threadId, context?.runId]) {
    if (typeof id === "string" && id !== "") return id;
  }
  return undefined;
}

/** As `createTool(options)`; `options.idem` holds idempotent()'s options, `scope` and `logger`. */
export function idempotentTool(options) {
  const { idem = {}, execute, ...rest } = options ?? {};
  if (typeof execute !== "function") throw new TypeError("idempotentTool needs execute");
  if (!rest.id) throw new TypeError("idempotentTool needs an id: it is the tool's name in every key");
  const { logger: given, scope, ...idemOptions } = idem;
  const logger = adapterLogger(given);
  const keyed = idempotent((_input, context, execOptions) => execute(context, execOptions), {
    ...idemOptions,
    tool: rest.id,
    scope: (_input, context) => {
      const chosen = typeof scope === "function" ? scope(context) : scope;
      if (chosen !== undefined && chosen !== null && chosen !== "") return chosen;
      return currentScope() ?? mastraScope(context);
    },
  });
  return createTool({
    ...rest,
    execute: async (context, execOptions) => {
      const { [KEY_ARGUMENT]: _written, ...input } = context?.context ?? {};
      try {
        return await keyed(input, context, execOptions);
      } catch (e) {
        throw forModel(rest.id, e, logger);
      }
    },
  });
}
