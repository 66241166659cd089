// An MCP server on the official TypeScript SDK (the version package-lock.json pins), whose
// parser is as lenient as JavaScript's: JSON.parse keeps the last of a duplicated member,
// reads 1e400 as Infinity and keeps a lone surrogate, and its streamable HTTP transport takes
// batches. `charge_card` has no annotations (an effect) and appends one line per charge to
// $CHARGES_FILE, so a test counts what actually ran; `get_balance` is read-only.
//
//   node lenient_mcp_server.mjs              stdio
//   node lenient_mcp_server.mjs --http 0     streamable HTTP at /mcp; prints "listening PORT"
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { randomUUID } from "node:crypto";

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const file = process.env.CHARGES_FILE;
if (!file) throw new Error("CHARGES_FILE must name the file charges are counted in");
const count = () => (existsSync(file) ? readFileSync(file, "utf8").split("\n").filter(Boolean).length : 0);

function server() {
  const s = new McpServer({ name: "lenient-payments", version: "0" });
  s.registerTool(
    "charge_card",
    { description: "Charges a card.", inputSchema: { customer: z.string(), amount_cents: z.number().optional() } },
    async ({ customer }) => {
      appendFileSync(file, `${JSON.stringify(customer)}\n`);
      return { content: [{ type: "text", text: `charged ${customer}` }], structuredContent: { charges: count() } };
    },
  );
  s.registerTool(
    "get_balance",
    { description: "Reads the number of charges.", inputSchema: {}, annotations: { readOnlyHint: true } },
    async () => ({ content: [{ type: "text", text: String(count()) }], structuredContent: { charges: count() } }),
  );
  return s;
}

const http = process.argv.indexOf("--http");
if (http < 0) {
  await server().connect(new StdioServerTransport());
} else {
  const sessions = new Map();
  const listener = createServer(async (req, res) => {
    const id = req.headers["mcp-session-id"];
    let transport = id && sessions.get(id);
    if (!transport) {
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: randomUUID,
        onsessioninitialized: (sid) => sessions.set(sid, transport),
      });
      await server().connect(transport);
    }
    await transport.handleRequest(req, res);
  });
  listener.listen(Number(process.argv[http + 1] ?? 0), "127.0.0.1", () => {
    console.log(`listening ${listener.address().port}`);
  });
}
