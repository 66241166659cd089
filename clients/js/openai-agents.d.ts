import type { tool } from "@openai/agents";
import type { IdempotentOptions } from "./index.js";

/** As `tool(options)` of @openai/agents, with a retry-safe execute; `idem` holds idempotent()'s options. */
export function idempotentTool(
  options: Parameters<typeof tool>[0] & { idem?: IdempotentOptions<any[]> },
): ReturnType<typeof tool>;
