// The example payment service on Hono (on @hono/node-server), made idempotent by idem's middleware:
//   PORT=3000 IDEM_CONFIG=idem.toml LEDGER=ledger.jsonl node hono_app.mjs
import { Hono } from "hono";
import { serve } from "@hono/node-server";
import { idempotency } from "idem-runtime/hono";

import * as ledger from "./ledger.mjs";

const app = new Hono();
const options = ledger.idemOptions();
if (options) app.use(await idempotency(options));

async function createCharge(c) {
  const f = ledger.fields(Buffer.from(await c.req.arrayBuffer()), c.req.header("content-type"));
  const { status, body, headers, stream } = await ledger.charge(f);
  if (stream) return new Response(ReadableStream.from(stream()), { headers: { "content-type": "text/event-stream" } });
  return c.json(body, status, headers);
}
app.post("/v1/charges", createCharge);
app.post("/v1/waits", createCharge);
app.get("/v1/charges", (c) => c.json({ count: ledger.count() }));
app.post("/v1/echo", async (c) => c.json({ echo: await c.req.text() }));

serve({ fetch: app.fetch, port: ledger.port, hostname: "127.0.0.1" }, () => console.log(`listening ${ledger.port}`));
