// The example payment service on Fastify, made idempotent by idem's plugin:
//   PORT=3000 IDEM_CONFIG=idem.toml LEDGER=ledger.jsonl node fastify_app.mjs
import { Readable } from "node:stream";

import Fastify from "fastify";
import { idempotency } from "idem-runtime/fastify";

import * as ledger from "./ledger.mjs";

const app = Fastify();
const options = ledger.idemOptions();
if (options) await app.register(idempotency, options);
app.addContentTypeParser("application/x-www-form-urlencoded", { parseAs: "string" }, (req, body, done) => done(null, body));

async function createCharge(request, reply) {
  const { status, body, headers, after, stream } = await ledger.charge(ledger.fields(request.body, request.headers["content-type"]));
  if (stream) return reply.code(200).header("content-type", "text/event-stream").send(Readable.from(stream()));
  reply.code(status).headers(headers).send(body);
  await after();
  return reply;
}
app.post("/v1/charges", createCharge);
app.post("/v1/waits", createCharge);
app.get("/v1/charges", async () => ({ count: ledger.count() }));
app.post("/v1/echo", async (request) => ({ echo: typeof request.body === "string" ? request.body : JSON.stringify(request.body) }));

await app.listen({ port: ledger.port, host: "127.0.0.1" });
console.log(`listening ${ledger.port}`);
