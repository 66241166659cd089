// idempotentClient over the MCP TypeScript SDK's Client, through `idem mcp` (runtime keys) in
// front of `idem example-mcp`: the key is in `_meta` on every attempt, so a reply lost once and
// the retry charge once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { writeFileSync } from "node:fs";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

import { deriveKey, withScope } from "../index.js";
import { idempotentClient } from "../mcp.js";
import { idemBinary, tmp } from "./helpers.mjs";

async function connect(t) {
  const dir = tmp(t);
  writeFileSync(join(dir, "idem-mcp.toml"), '[tools.charge_card]\nkey = "runtime"\n');
  const idem = idemBinary();
  const transport = new StdioClientTransport({
    command: idem,
    args: ["mcp", "--store", `sqlite:${join(dir, "idem.db")}`, "--policy", join(dir, "idem-mcp.toml"), "--", idem, "example-mcp", "--db", join(dir, "charges.db")],
    stderr: "inherit",
  });
  const c = new Client({ name: "idem-runtime-test", version: "0" });
  await c.connect(transport);
  t.after(() => c.close());
  return c;
}

const charges = async (c) => (await c.callTool({ name: "get_balance", arguments: { customer: "cus_mcp" } })).structuredContent.charges;

test("a reply lost once: the retry carries the same _meta key and the card is charged once", async (t) => {
  const real = await connect(t);
  let lost = false;
  const sent = [];
  // A transport that loses the first reply after the server acted.
  const lossy = {
    callTool: async (params, ...rest) => {
      sent.push(params._meta?.idempotency_key);
      const r = await real.callTool(params, ...rest);
      if (!lost) {
        lost = true;
        throw new Error("connection lost before the reply");
      }
      return r;
    },
  };
  const c = idempotentClient(lossy, { tools: { get_balance: "read" }, sleep: async () => {} });
  const args = { customer: "cus_mcp", amount_cents: 4900 };
  const reply = await withScope("run-mcp-1", () => c.callTool({ name: "charge_card", arguments: args }));
  assert.notEqual(reply.isError, true, JSON.stringify(reply));
  assert.equal(reply._meta?.idem?.replayed, true);
  const key = deriveKey("run-mcp-1", "charge_card", args);
  assert.deepEqual(sent, [key, key]);
  assert.equal(await charges(real), 1);

  // The model invents a key in the arguments: the runtime's key decides.
  const again = await withScope("run-mcp-1", () =>
    idempotentClient(real).callTool({ name: "charge_card", arguments: { ...args, idempotency_key: "made-up" } }),
  );
  assert.equal(again._meta?.idem?.replayed, true);
  assert.equal(await charges(real), 1);
  // Other methods pass through.
  assert.ok((await idempotentClient(real).listTools()).tools.length > 0);
});
