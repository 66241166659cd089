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
    .then(({ status, body, headers }) => res.status(status).set(headers).json(body), next);
}
app.post(["/v1/charges", "/v1/waits"], createCharge);
app.get("/v1/charges", (req, res) => res.json({ count: ledger.count() }));
app.post("/v1/echo", (req, res) => res.json({ echo: typeof req.body === "string" ? req.body : JSON.stringify(req.body) }));

app.listen(ledger.port, "127.0.0.1", () => console.log(`listening ${ledger.port}`));
