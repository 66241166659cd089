// The official `stripe` Node SDK, a client nobody here wrote, against the example Express
// payment service with idem's middleware (examples/services/node), through a link that loses
// answers after the service acted. The SDK sends an Idempotency-Key on every POST and retries
// lost answers with it: exactly one charge per call; without the middleware, more. With
// `[problems] format = "stripe"` the SDK raises its own StripeIdempotencyError for a reused key
// and for a conflict in flight (a problem+json document was read as a charge with no id).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";

import { repo, tmp } from "./helpers.mjs";

const SERVICES = join(repo, "examples", "services", "node");
const required = process.env.IDEM_REQUIRE_SERVICES === "1";
let Stripe = null;
let why = null;
try {
  Stripe = (await import("stripe")).default;
} catch (e) {
  why = `the stripe SDK is not installed (cd clients/js && npm ci): ${e.message}`;
}
if (!why && !existsSync(join(SERVICES, "node_modules", "express"))) {
  why = "the example services' packages are not installed (cd examples/services/node && npm ci)";
}
if (why && required) throw new Error(`IDEM_REQUIRE_SERVICES=1 but ${why}`);
const skip = why ?? false;

const CONFIG = '[problems]\nformat = "stripe"\n[[routes]]\nmethod = "POST"\npath = "/v1/charges"\n';

const charges = (ledger) => (existsSync(ledger) ? readFileSync(ledger, "utf8").split("\n").filter(Boolean).length : 0);

/** The example Express service on a free port (with idem unless `idem` is false). */
async function service(t, idem) {
  const dir = tmp(t);
  const ledger = join(dir, "ledger.jsonl");
  writeFileSync(join(dir, "idem.toml"), CONFIG);
  const port = await freePort();
  const child = spawn(process.execPath, ["express_app.mjs"], {
    cwd: SERVICES,
    env: { ...process.env, PORT: String(port), LEDGER: ledger, IDEM_CONFIG: idem ? join(dir, "idem.toml") : "off", IDEM_STORE: `sqlite:${join(dir, "idem.db")}` },
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(() => child.kill("SIGKILL"));
  await new Promise((resolve, reject) => {
    child.stdout.on("data", (d) => d.toString().includes("listening") && resolve());
    child.once("exit", (code) => reject(new Error(`the example service exited (${code})`)));
  });
  return { port, ledger };
}

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** TCP to `port`; while `drops` > 0, the next answer to a charge is lost: the client's connection is reset. */
async function lossyLink(t, port) {
  const link = { drops: 0, dropped: 0 };
  const server = net.createServer((client) => {
    const upstream = net.connect(port, "127.0.0.1");
    let asked = "";
    client.on("data", (d) => {
      asked += d.toString("latin1");
      upstream.write(d);
    });
    upstream.on("data", (d) => {
      if (link.drops > 0 && asked.includes("POST /v1/charges")) {
        link.drops -= 1;
        link.dropped += 1;
        client.resetAndDestroy();
        upstream.destroy();
        return;
      }
      asked = "";
      client.write(d);
    });
    for (const [a, b] of [[client, upstream], [upstream, client]]) {
      a.on("error", () => b.destroy());
      a.on("close", () => b.destroy());
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => server.close());
  link.port = server.address().port;
  return link;
}

const sdk = (port, maxNetworkRetries) =>
  new Stripe("sk_test_idem_0123456789", { host: "127.0.0.1", port, protocol: "http", maxNetworkRetries });

/** 40 charges through a link that loses 30% of the answers (seeded): the charges made, and the answers lost. */
async function chargeThroughLoss(t, idem) {
  const svc = await service(t, idem);
  const link = await lossyLink(t, svc.port);
  const stripe = sdk(link.port, 8);
  let seed = 42;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let i = 0; i < 40; i++) {
    link.drops = random() < 0.3 ? 1 : 0;
    const charge = await stripe.charges.create({ amount: 100 + i, currency: "usd", customer: `cus_${i}` });
    assert.match(charge.id, /^ch_/);
  }
  return { made: charges(svc.ledger), lost: link.dropped };
}

test("the stripe SDK's retries of lost answers charge once per call; without idem they charge again", { skip }, async (t) => {
  const withIdem = await chargeThroughLoss(t, true);
  assert.ok(withIdem.lost > 0, "the link lost answers");
  assert.equal(withIdem.made, 40, `${withIdem.lost} answers lost, retried with the SDK's key`);
  const without = await chargeThroughLoss(t, false);
  assert.equal(without.made, 40 + without.lost, "without idem every lost answer's retry charged again");
  console.log(`40 calls: ${withIdem.lost} answers lost, ${withIdem.made} charges with idem; ${without.lost} lost, ${without.made} without`);
});

test("the stripe SDK raises StripeIdempotencyError for a reused key and for a conflict in flight", { skip }, async (t) => {
  const svc = await service(t, true);
  const stripe = sdk(svc.port, 0);
  const first = await stripe.charges.create({ amount: 4900, currency: "usd" }, { idempotencyKey: "order-7" });
  const again = await stripe.charges.create({ amount: 4900, currency: "usd" }, { idempotencyKey: "order-7" });
  assert.equal(again.id, first.id);
  await assert.rejects(
    stripe.charges.create({ amount: 100, currency: "usd" }, { idempotencyKey: "order-7" }),
    (e) => e instanceof Stripe.errors.StripeIdempotencyError && e.statusCode === 400,
  );
  const slow = { amount: 4900, currency: "usd", simulate: "slow", delay_ms: 8000 };
  const running = stripe.charges.create(slow, { idempotencyKey: "order-8" });
  const deadline = Date.now() + 20000;
  while (charges(svc.ledger) < 2) {
    assert.ok(Date.now() < deadline, "the slow charge never started");
    await new Promise((r) => setTimeout(r, 50));
  }
  // Stripe-Should-Retry: true makes the SDK retry; still in flight, it raises.
  await assert.rejects(
    sdk(svc.port, 1).charges.create(slow, { idempotencyKey: "order-8" }),
    (e) => e instanceof Stripe.errors.StripeIdempotencyError && e.code === "in-flight",
  );
  assert.equal((await running).object, "charge");
  assert.equal(charges(svc.ledger), 2);
});
