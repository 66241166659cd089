// The example payment service's one effect, shared by its Express, Fastify and Hono versions:
// a charge is a line appended to the ledger file ($LEDGER). The contract every example service
// follows is in conformance/http/README.md (the Python services' ledger.py says the same).
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { randomBytes } from "node:crypto";

const LEDGER = process.env.LEDGER ?? "ledger.jsonl";

/** The request's fields: JSON, or a form (Stripe's SDKs send forms). */
export function fields(body, contentType) {
  // Already parsed (express.json(), express.urlencoded(), Fastify's JSON parser).
  if (body && typeof body === "object" && !Buffer.isBuffer(body)) return body;
  const text = Buffer.isBuffer(body) ? body.toString() : typeof body === "string" ? body : "";
  if (contentType?.startsWith("application/x-www-form-urlencoded")) {
    return Object.fromEntries(new URLSearchParams(text));
  }
  try {
    const v = JSON.parse(text || "{}");
    return v && typeof v === "object" && !Array.isArray(v) ? v : {};
  } catch {
    return {};
  }
}

export function count() {
  return existsSync(LEDGER) ? readFileSync(LEDGER, "utf8").split("\n").filter(Boolean).length : 0;
}

export class Raised extends Error {}

/** Runs one request: { status, body, headers }, after `await` for a slow one; throws Raised for `simulate: "raise"`. */
export async function charge(f) {
  const simulate = f.simulate ?? "";
  const status = simulate === "status" ? Number(f.status ?? 201) : 201;
  const amount = Number(f.amount_cents ?? f.amount ?? 0);
  const charge = { id: `ch_${randomBytes(6).toString("hex")}`, object: "charge", customer: f.customer ?? null, amount };
  // One short O_APPEND write per charge: lines from many processes never interleave.
  if (status !== 429 && status !== 503) appendFileSync(LEDGER, `${JSON.stringify(charge)}\n`);
  const headers = {};
  if (simulate === "slow") await new Promise((r) => setTimeout(r, Number(f.delay_ms ?? 1500)));
  else if (simulate === "raise") throw new Raised(`failed after charging ${charge.id}`);
  else if (simulate === "large") charge.padding = "x".repeat(Number(f.size ?? 2 * 1024 * 1024));
  else if (simulate === "cookie") headers["set-cookie"] = `session=${charge.id}; Path=/; HttpOnly`;
  return { status, body: charge, headers, after: () => after(f), stream: simulate === "stream" ? events : null };
}

/** The work `simulate: "after"` asks to run after the response: sleeps `delay_ms`, then throws. */
async function after(f) {
  if (f.simulate !== "after") return;
  await new Promise((r) => setTimeout(r, Number(f.delay_ms ?? 2000)));
  throw new Raised("the work after the response failed");
}

/** Who waits for the next event: a broker's subscriber list, which keeps every stream alive. */
const subscribers = new Set();

/** `simulate: "stream"`: an event stream that sends one event and never ends. */
async function* events() {
  yield "data: charged\n\n";
  await new Promise((resolve) => subscribers.add(resolve));
}

/** The idem options of an example: $IDEM_CONFIG names the TOML file; "off" runs the service bare. */
export function idemOptions() {
  const config = process.env.IDEM_CONFIG ?? "idem.toml";
  return config === "off" ? null : { config };
}

export const port = Number(process.env.PORT ?? 3000);
