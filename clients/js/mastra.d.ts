import type { AdapterLogger, IdempotentOptions, ScopeLike } from "./index.js";

// Structural, not @mastra/core's own types: those of 0.24 do not compile against zod 4 with
// skipLibCheck off, and the tool this returns is createTool()'s, whatever its declared type.

/** What Mastra hands a tool's execute (0.24): the input as `context`, the run, the thread, the runtime context. */
export type MastraToolContext<I = any> = {
  context: I;
  runId?: string;
  threadId?: string;
  resourceId?: string;
  runtimeContext: { get(key: string): unknown };
} & Record<string, any>;

export interface MastraIdemOptions extends Omit<IdempotentOptions<any[]>, "tool" | "scope"> {
  /** The scope, or a function of the tool's execution context; default withScope, then the thread, then the run. */
  scope?: ScopeLike | ((context: MastraToolContext) => ScopeLike | undefined | null);
  /** Where refusals no model can fix are logged at error level (default console; `mastra.getLogger()` fits). */
  logger?: AdapterLogger;
}

/** createTool()'s options, as far as idem reads them. */
export interface MastraToolOptions<I = any, O = any> {
  id: string;
  description: string;
  inputSchema?: unknown;
  outputSchema?: unknown;
  execute: (context: MastraToolContext<I>, options?: any) => Promise<O>;
  [option: string]: unknown;
}

/** A Mastra tool (createTool()'s result). */
export interface MastraTool<O = any> {
  id: string;
  description: string;
  execute?: (context: any, options?: any) => Promise<O>;
}

/** As `createTool(options)` of @mastra/core, with a retry-safe execute; `idem` holds the options above. */
export function idempotentTool<I, O>(options: MastraToolOptions<I, O> & { idem?: MastraIdemOptions }): MastraTool<O>;

/** The scope Mastra offers a tool call: the memory thread, else the run; undefined if neither. */
export function mastraScope(context: { runId?: string; threadId?: string } | undefined): string | undefined;
