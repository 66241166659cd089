// Compiled, never run (`npm run typecheck`): the package's declarations describe the API the
// README shows, for a TypeScript caller.
import { tool } from "ai";
import { z } from "zod";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";

import {
  ConfigurationError,
  IdemError,
  InFlightError,
  KeyDerivationError,
  OutcomeUnknownError,
  Scope,
  ToolArgumentsError,
  currentScope,
  deriveKey,
  idemFetch,
  idempotent,
  jsonCodec,
  withScope,
} from "idem-runtime";
import { withIdempotency } from "idem-runtime/ai";
import { idempotentTool } from "idem-runtime/openai-agents";
import { idempotentClient } from "idem-runtime/mcp";
import { derive } from "idem-runtime/key";

class Declined extends Error {}

const charge = idempotent(async (args: { customer: string; amount: number }) => ({ id: "ch_1", ...args }), {
  tool: "charge_card",
  store: "sqlite:idem.db",
  keyFields: ["customer", "amount"],
  keepErrors: [Declined, "RateLimited"],
  wait: null,
  codec: jsonCodec,
});

export async function main(): Promise<string> {
  const r = await withScope("run-1", () => charge({ customer: "c", amount: 5 }));
  const id: string = r.id;
  const { value, outcome } = await charge.callWithOutcome({ customer: "c", amount: 5 });
  const replayedId: string = value.id;
  const seen: [string, boolean, string] = [outcome.key, outcome.replayed, outcome.saved];
  const s: Scope | undefined = currentScope();
  const again = Scope.from(JSON.parse(JSON.stringify(new Scope("x"))));
  try {
    await charge({ customer: "c", amount: 5 });
  } catch (e) {
    if (e instanceof InFlightError || e instanceof OutcomeUnknownError) console.log(e.key);
    if (e instanceof IdemError) console.log(e.message);
    if (e instanceof ToolArgumentsError || e instanceof KeyDerivationError || e instanceof ConfigurationError) console.log(e.key);
  }
  const res: Response = await idemFetch("http://localhost/charge", { idem: { tool: "charge_card", args: { a: 1 }, scope: "run-1", keyHeader: "bare", keyInBody: false } });
  const tools = withIdempotency(
    { add_row: tool({ inputSchema: z.object({ customer: z.string() }), execute: async ({ customer }) => customer }) },
    { store: "memory:" },
  );
  const one = withIdempotency(tool({ inputSchema: z.object({ n: z.number() }), execute: async ({ n }) => n }), { tool: "n" });
  const agentTool = idempotentTool({
    name: "add_row",
    description: "adds a row",
    parameters: z.object({ customer: z.string() }),
    execute: async ({ customer }: { customer: string }) => customer,
    idem: { store: "memory:" },
  });
  const client = idempotentClient(new Client({ name: "x", version: "0" }), { tools: { get_balance: "read" } });
  void [tools, one, agentTool, client, s, again, res];
  return id + deriveKey("run-1", "t", { a: 1 }) + derive("run-1", "t", { a: 1 });
}

// The HTTP middleware: the same options on every framework.
import { idempotency as expressIdempotency } from "idem-runtime/express";
import { idempotency as fastifyIdempotency } from "idem-runtime/fastify";
import { idempotency as honoIdempotency } from "idem-runtime/hono";

const httpOptions = {
  config: "idem.toml",
  anonymous: "allow" as const,
  routes: [{ method: "POST", path: "/v1/charges", wait: "5s" }],
  problems: { format: "stripe" as const },
};
export const forExpress: Promise<(req: any, res: any, next: (error?: unknown) => void) => void> = expressIdempotency(httpOptions);
export const forFastify: (app: any) => Promise<void> = (app) => fastifyIdempotency(app, httpOptions);
export const forHono = honoIdempotency({ store: "memory:" });

// The agent frameworks of the second round.
import { createAgent, tool as lcTool } from "langchain";
import { idempotencyMiddleware, idempotentTools } from "idem-runtime/langchain";
import { idempotentTool as mastraTool } from "idem-runtime/mastra";

const lcCharge = lcTool(async ({ customer }: { customer: string }) => customer, {
  name: "charge_card",
  description: "charges",
  schema: z.object({ customer: z.string() }),
});
export const lcAgent = createAgent({
  model: "openai:gpt-4o",
  tools: [lcCharge],
  middleware: [idempotencyMiddleware({ tools: ["charge_card"], store: "sqlite:idem.db", scope: (call) => `order-${call.args.order_id}`, logger: console })],
});
export const forToolNode = idempotentTools([lcCharge], { store: "memory:", keyFields: { charge_card: ["customer"] } });
export const mastraCharge = mastraTool({
  id: "charge_card",
  description: "charges",
  inputSchema: z.object({ customer: z.string() }),
  execute: async ({ context }: { context: { customer: string } }) => context.customer,
  idem: { store: "memory:", scope: ({ runtimeContext }) => runtimeContext.get("orderId") as string, wait: null },
});
