import type { IdempotentOptions } from "./index.js";

type AnyTool = { execute?: (...args: any[]) => any } & Record<string, any>;
/** Wraps one AI SDK tool (name it with `tool`) or a whole tools object (named by its keys). */
export function withIdempotency<T extends AnyTool>(tool: T, options: IdempotentOptions<any[]> & { tool: string }): T;
export function withIdempotency<T extends Record<string, AnyTool>>(tools: T, options?: IdempotentOptions<any[]>): T;
