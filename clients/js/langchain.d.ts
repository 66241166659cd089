import type { AgentMiddleware } from "langchain";
import type { AdapterLogger, IdempotentOptions, ScopeLike } from "./index.js";

/** A tool call as LangChain hands it to a tool: name, the model's arguments, its id. */
export interface LangChainToolCall {
  name: string;
  args: Record<string, any>;
  id?: string;
}
/** What the run offers a tool call: the config's `configurable` (thread_id), `context`, ... */
export type LangChainRuntime = { configurable?: Record<string, any>; context?: any } & Record<string, any>;

export interface LangChainIdemOptions extends Omit<IdempotentOptions<any[]>, "tool" | "scope" | "keyFields" | "codec"> {
  /** The scope, or a function of the tool call and the run; default the thread id, then withScope. */
  scope?: ScopeLike | ((toolCall: LangChainToolCall, runtime: LangChainRuntime) => ScopeLike | undefined | null);
  /** Per tool name, the arguments that make the intent. */
  keyFields?: Record<string, string[]>;
  /** Where refusals no model can fix are logged at error level (default console). */
  logger?: AdapterLogger;
}

/**
 * A LangChain v1 agent middleware (`createMiddleware({ wrapToolCall })`) that makes the named
 * tools at most once per intent, scoped by the LangGraph thread id (`configurable.thread_id`).
 * Every answer's `response_metadata.idem` is `{ key, replayed }`; a duplicate in flight or an
 * unknown outcome is an error ToolMessage saying what to do; idem not configured ends the run.
 */
export function idempotencyMiddleware(options: LangChainIdemOptions & { tools: Array<string | { name: string }> }): AgentMiddleware;

/** The given tools, each at most once per intent, for LangGraph's `ToolNode` (same tools, keyed `invoke`). */
export function idempotentTools<T extends { name: string; invoke: (...args: any[]) => any }>(tools: T[], options?: LangChainIdemOptions): T[];

/** The thread id of a run's config (`configurable.thread_id`), or undefined. */
export function threadScope(runtime: LangChainRuntime | undefined): string | undefined;
