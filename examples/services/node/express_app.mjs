// The example payment service on Express, made idempotent by idem's middleware:
//   PORT=3000 IDEM_CONFIG=idem.toml LEDGER=ledger.jsonl node express_app.mjs
// EXPRESS=express4 runs it on Express 4 (package.json installs it under that name).
import { idempotency } from "idem-runtime/express";

const { default: express } = await import(process.env.EXPRESS ?? "express");

import * as ledger from "./ledger.mjs";

const app = express();
const options = ledger.idemOptions();
if (options) app.use(await idempotency(options)); // before the body parsers
app.use(express.json(), express.urlencoded({ extended: false }), express.text({ type: "*/*" }));

// Express 4 does not catch a rejected handler: errors go to next() by hand.
function createCharge(req, res, next) {
  ledger
    .charge(ledger.fields(req.body, req.headers["content-type"]))
    .then(({ status, body, headers, after, stream }) => {
      if (stream) {
        res.status(200).set("content-type", "text/event-stream");
        return (async () => {
          for await (const event of stream()) res.write(event);
        })();
      }
      res.status(status).set(headers).json(body);
      // What runs after the response (simulate: "after"), its error Express's.
      return after();
    })
    .catch(next);
}
app.post(["/v1/charges", "/v1/waits"], createCharge);
app.get("/v1/charges", (req, res) => res.json({ count: ledger.count() }));
app.post("/v1/echo", (req, res) => res.json({ echo: typeof req.body === "string" ? req.body : JSON.stringify(req.body) }));

// MOUNT=/api serves it all below /api (app.use("/api", app)), the middleware inside: its
// routes are matched below the mount, as Express routes there.
const root = process.env.MOUNT ? express().use(process.env.MOUNT, app) : app;
root.listen(ledger.port, "127.0.0.1", () => console.log(`listening ${ledger.port}`));
