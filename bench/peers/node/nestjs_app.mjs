// The example payment service on NestJS 10 (Express platform), made idempotent by
// @node-idempotency/nestjs (npm), set up as its README says: NodeIdempotencyModule.forRootAsync
// with the library's Redis storage adapter, and @Idempotent() on the handlers. The charge routes
// pass `enforceIdempotency: true` (a key is required there); /v1/echo honours a key without
// requiring one.
//   PORT=3000 LEDGER=ledger.jsonl node nestjs_app.mjs
// Plain JavaScript, no TypeScript build: the decorators are applied by hand with
// Reflect.decorate, which is what TypeScript's compiled output does.
import "reflect-metadata";
import common from "@nestjs/common";
import core from "@nestjs/core";
import nodeIdempotency from "@node-idempotency/nestjs";

import * as ledger from "../../../examples/services/node/ledger.mjs";

const { Controller, Get, HttpCode, Module, Post, Req, Res } = common;
const { NestFactory } = core;
const { Idempotent, NodeIdempotencyModule, StorageAdapterEnum } = nodeIdempotency;

/** Redis for the store: the suite's relay when it hands one out (the store-down case), else the machine's. */
function redisUrl() {
  const store = process.env.IDEM_STORE ?? "";
  if (store.startsWith("redis://")) {
    const u = new URL(store);
    return `redis://${u.hostname}:${u.port || 6379}`;
  }
  return "redis://127.0.0.1:6379";
}

class Charges {
  // `passthrough`: the handler sets status and headers, Nest still sends what it returns, so
  // the interceptor sees (and stores) the body.
  async create(req, res) {
    const { status, body, headers } = await ledger.charge(ledger.fields(req.body, req.headers["content-type"]));
    res.status(status).set(headers);
    return body;
  }

  count() {
    return { count: ledger.count() };
  }

  echo(req) {
    return { echo: typeof req.body === "string" ? req.body : JSON.stringify(req.body) };
  }
}

function method(decorators, name) {
  const proto = Charges.prototype;
  const d = Reflect.decorate(decorators, proto, name, Object.getOwnPropertyDescriptor(proto, name));
  Object.defineProperty(proto, name, d);
}
Req()(Charges.prototype, "create", 0);
Res({ passthrough: true })(Charges.prototype, "create", 1);
Req()(Charges.prototype, "echo", 0);
method([Post(["/v1/charges", "/v1/waits"]), Idempotent({ enforceIdempotency: true })], "create");
method([Get("/v1/charges")], "count");
// Nest answers a POST 201 unless told otherwise; the contract's echo answers 200.
method([Post("/v1/echo"), HttpCode(200), Idempotent()], "echo");
const ChargesController = Reflect.decorate([Controller()], Charges);

class App {}
const AppModule = Reflect.decorate(
  [
    Module({
      imports: [
        NodeIdempotencyModule.forRootAsync({
          storage: { adapter: StorageAdapterEnum.redis, options: { url: redisUrl() } },
          // This run's namespace in the shared Redis (bench/compare_peers.py sets a fresh one).
          cacheKeyPrefix: process.env.PEER_PREFIX ?? "idem-peers",
        }),
      ],
      controllers: [ChargesController],
    }),
  ],
  App,
);

const app = await NestFactory.create(AppModule, { logger: ["error", "warn"] });
await app.listen(ledger.port, "127.0.0.1");
console.log(`listening ${ledger.port}`);
