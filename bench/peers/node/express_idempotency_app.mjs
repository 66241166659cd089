// The example payment service on Express 5, made idempotent by express-idempotency (npm), set
// up as its README's "Getting started" says: the middleware on every POST route, the handler
// returning early when `isHit(req)` (the middleware replays, then still calls next()), and
// `reportError(req)` when processing fails. Its store is the default in-memory adapter: the
// README's one other adapter needs MongoDB, which this machine does not have.
//   PORT=3000 LEDGER=ledger.jsonl node express_idempotency_app.mjs
// What it cannot be told (the suite shows the difference): to require a key, who the caller is.
import express from "express";
import expressIdempotency from "express-idempotency";

import * as ledger from "../../../examples/services/node/ledger.mjs";

const { idempotency, getSharedIdempotencyService } = expressIdempotency;

const app = express();
// Before the middleware: its default intent check compares the parsed body.
app.use(express.json(), express.urlencoded({ extended: false }), express.text({ type: "*/*" }));
// The README's `app.post('*', ...)`, spelled for Express 5's router.
app.post("/{*path}", idempotency());

function createCharge(req, res, next) {
  const service = getSharedIdempotencyService();
  if (service.isHit(req)) return; // already answered from the store
  ledger.charge(ledger.fields(req.body, req.headers["content-type"])).then(
    ({ status, body, headers }) => res.status(status).set(headers).json(body),
    async (err) => {
      await service.reportError(req); // the README: tell the middleware, so it forgets the key
      next(err);
    },
  );
}
app.post(["/v1/charges", "/v1/waits"], createCharge);
app.get("/v1/charges", (req, res) => res.json({ count: ledger.count() }));
app.post("/v1/echo", (req, res) => {
  if (getSharedIdempotencyService().isHit(req)) return;
  res.json({ echo: typeof req.body === "string" ? req.body : JSON.stringify(req.body) });
});

app.listen(ledger.port, "127.0.0.1", () => console.log(`listening ${ledger.port}`));
