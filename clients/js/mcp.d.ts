import type { Attempt, RetryPolicyShape, ScopeLike } from "./index.js";

export interface IdempotentClientOptions {
  scope?: ScopeLike | ((params: { name: string; arguments?: Record<string, unknown> }) => ScopeLike);
  secret?: string | Uint8Array;
  /** Key fields per tool. */
  keyFields?: Record<string, string[]>;
  /** Tool classes; unknown tools are effects (keyed). */
  tools?: Record<string, "read" | "idempotent" | "effect">;
  retry?: Partial<RetryPolicyShape>;
  sleep?: (ms: number) => Promise<void>;
  onAttempt?: (attempt: Omit<Attempt, "status"> & { problem?: string }) => void;
}
/** The same client, whose callTool puts the runtime's key in `params._meta.idempotency_key` on every attempt. */
export function idempotentClient<C extends { callTool: (...args: any[]) => any }>(client: C, options?: IdempotentClientOptions): C;
