import type { tool } from "@openai/agents";
import type { AdapterLogger, IdempotentOptions } from "./index.js";

/**
 * As `tool(options)` of @openai/agents, with a retry-safe execute; `idem` holds idempotent()'s
 * options and `logger`. A refusal no model can fix (no scope, a bad store URL, arguments with no
 * key, the store down) fails the run and is logged at error level; a duplicate in flight or an
 * unknown outcome is the tool's output, saying what to do; other errors go to `errorFunction`.
 */
export function idempotentTool(
  options: Parameters<typeof tool>[0] & { idem?: IdempotentOptions<any[]> & { logger?: AdapterLogger } },
): ReturnType<typeof tool>;
