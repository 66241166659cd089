import type { AdapterLogger, IdempotentOptions } from "./index.js";

type AnyTool = { execute?: (...args: any[]) => any } & Record<string, any>;
/**
 * idempotent()'s options, and `logger`: where a refusal no model can fix (no scope, a bad store
 * URL, arguments with no key, the store down) is logged at error level (default console), since
 * the AI SDK hands every tool error to the model and goes on.
 */
export type WithIdempotencyOptions = IdempotentOptions<any[]> & { logger?: AdapterLogger };
/**
 * Wraps one AI SDK tool (name it with `tool`) or a whole tools object (named by its keys). The
 * runtime owns the key: an `idempotency_key` the model writes into the arguments is neither
 * the key nor part of the intent (a model writes a new one on each retry); `execute` gets the
 * derived key there instead.
 */
export function withIdempotency<T extends AnyTool>(tool: T, options: WithIdempotencyOptions & { tool: string }): T;
export function withIdempotency<T extends Record<string, AnyTool>>(tools: T, options?: WithIdempotencyOptions): T;
