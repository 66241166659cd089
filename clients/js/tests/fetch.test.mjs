// idemFetch against a local HTTP server that fails the first attempts: the key is derived once
// and sent on every attempt (header and body), backoff and Retry-After, no retry of 400/422 or
// of an unkeyed effect that may have been sent. Sleeps are recorded, not waited for.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";

import { IdemError, deriveKey, idemFetch, withScope } from "../index.js";
import { requestIntent } from "../fetch.js";

/** A server answering attempt n with script[n-1] (a status, or "drop" to cut the connection). */
async function server(t, script) {
  const seen = [];
  const s = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      seen.push({ key: req.headers["idempotency-key"], body: body ? JSON.parse(body) : null });
      const step = script[Math.min(seen.length, script.length) - 1];
      if (step === "drop") return req.socket.destroy();
      const [status, headers = {}] = Array.isArray(step) ? step : [step];
      res.writeHead(status, { "content-type": "application/json", ...headers });
      res.end(JSON.stringify({ attempt: seen.length }));
    });
  });
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  t.after(() => new Promise((r) => s.close(r)));
  return { url: `http://127.0.0.1:${s.address().port}/charge_card`, seen };
}

/** Records sleeps instead of waiting, on a clock that they advance. */
function recorder() {
  const sleeps = [];
  let clock = 0;
  return {
    sleeps,
    sleep: async (ms) => {
      sleeps.push(ms);
      clock += ms;
    },
    now: () => clock,
  };
}

/** A port nothing listens on (not one fetch blocks, such as 1). */
async function closedPort() {
  const s = createServer();
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

const args = { customer: "cus_f", amount_cents: 4900 };

test("a keyed effect is retried through 503 and a dropped connection with one key, sent as the header (an sf-string), the body as given", async (t) => {
  const { url, seen } = await server(t, [503, "drop", 200]);
  const { sleeps, sleep } = recorder();
  const res = await withScope("run-fetch", () => idemFetch(url, { idem: { tool: "charge_card", args, sleep } }));
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { attempt: 3 });
  const key = deriveKey("run-fetch", "charge_card", JSON.parse(requestIntent(url, "POST", args)));
  assert.equal(seen.length, 3);
  for (const s of seen) {
    assert.equal(s.key, `"${key}"`);
    assert.deepEqual(s.body, args);
  }
  assert.equal(sleeps.length, 2);
  assert.ok(sleeps[0] <= 100 && sleeps[1] <= 200, `full jitter under the doubling bound: ${sleeps}`);
});

test("the bare header and the key in the body are the caller's choice", async (t) => {
  const { url, seen } = await server(t, [200]);
  await idemFetch(url, { idem: { args, scope: "s", keyHeader: "bare", keyInBody: true, sleep: recorder().sleep } });
  const key = deriveKey("s", "charge_card", JSON.parse(requestIntent(url, "POST", args)));
  assert.deepEqual(seen, [{ key, body: { ...args, idempotency_key: key } }]);
  await assert.rejects(idemFetch(url, { idem: { args, scope: "s", keyHeader: "quoted" } }), /keyHeader is "sf-string" .* or "bare"/);
  assert.equal(seen.length, 1, "nothing sent for a bad option");
});

test("400 and 422 end the call at once", async (t) => {
  for (const status of [400, 422, 404]) {
    const { url, seen } = await server(t, [status, 200]);
    const res = await idemFetch(url, { idem: { args, scope: "s", sleep: recorder().sleep } });
    assert.equal(res.status, status);
    assert.equal(seen.length, 1);
  }
});

test("Retry-After on 429, 409 and 503 is a lower bound of the wait; attempts are bounded", async (t) => {
  const { url, seen } = await server(t, [[429, { "retry-after": "3" }], [409, { "retry-after": "1" }], [503, { "retry-after": "2" }]]);
  const { sleeps, sleep } = recorder();
  const res = await idemFetch(url, { idem: { args, scope: "s", sleep } });
  assert.equal(res.status, 503, "the last answer, after five attempts");
  assert.equal(seen.length, 5);
  assert.ok(sleeps[0] >= 3000 && sleeps[1] >= 1000 && sleeps[2] >= 2000, String(sleeps));
});

test("no attempt starts after the total bound", async (t) => {
  const { url, seen } = await server(t, [[503, { "retry-after": "30" }]]);
  const res = await idemFetch(url, { idem: { args, scope: "s", ...recorder() } });
  assert.equal(res.status, 503);
  assert.equal(seen.length, 3, "at 0, 30 s and 60 s; a fourth would start past 60 s");
});

test("an unkeyed effect is not repeated once it may have been sent; only a 429 or a refused connection", async (t) => {
  const dropped = await server(t, ["drop", 200]);
  await assert.rejects(idemFetch(dropped.url, { idem: { key: null, args, sleep: recorder().sleep } }), IdemError);
  assert.equal(dropped.seen.length, 1);
  assert.equal(dropped.seen[0].key, undefined);

  const failed = await server(t, [500, 200]);
  assert.equal((await idemFetch(failed.url, { idem: { key: null, args, sleep: recorder().sleep } })).status, 500);
  assert.equal(failed.seen.length, 1);

  const limited = await server(t, [429, 200]);
  assert.equal((await idemFetch(limited.url, { idem: { key: null, args, sleep: recorder().sleep } })).status, 200);
  assert.equal(limited.seen.length, 2);

  // Nothing listens: surely not sent, so even an unkeyed effect is tried again.
  const attempts = [];
  await assert.rejects(
    idemFetch(`http://127.0.0.1:${await closedPort()}/charge_card`, {
      idem: { key: null, args, sleep: recorder().sleep, onAttempt: (a) => attempts.push(a) },
    }),
    /gave up after 5 attempts/,
  );
  assert.equal(attempts.length, 5);
});

test("reads carry no key and are retried", async (t) => {
  const { url, seen } = await server(t, ["drop", 200]);
  const res = await idemFetch(url, { method: "GET", idem: { class: "read", sleep: recorder().sleep } });
  assert.equal(res.status, 200);
  assert.deepEqual(seen.map((s) => s.key), [undefined, undefined]);
});

test("a request's method and URL are part of its intent: two customers' URLs with one body get two keys (issue 60)", async (t) => {
  const { url, seen } = await server(t, [201]);
  const base = url.replace(/\/charge_card$/, "");
  const body = { amount_cents: 100 };
  const sleep = recorder().sleep;
  const send = (path, method = "POST", args = body) =>
    withScope("run-60", () => idemFetch(`${base}${path}`, { method, idem: { tool: "charge", args, sleep } }));
  await send("/v1/customers/cus_1/charges");
  await send("/v1/customers/cus_2/charges");
  await send("/v1/charges?customer=cus_3");
  await send("/v1/charges?customer=cus_4");
  await send("/orders/o_1/cancel", "POST", undefined);
  await send("/orders/o_2/cancel", "POST", undefined);
  const keys = seen.map((s) => s.key);
  assert.equal(new Set(keys).size, keys.length, keys.join(" "));
  // One intent sent twice keeps its key.
  await send("/v1/charges?customer=cus_3");
  assert.equal(seen.at(-1).key, keys[2]);
});

test("a JSON body given as body is keyed; a body that is not JSON, or body and idem.args together, are refused before anything is sent", async (t) => {
  const { url, seen } = await server(t, [201]);
  const sleep = recorder().sleep;
  const send = (body) => withScope("run-60b", () => idemFetch(url, { method: "POST", body, headers: { "content-type": "application/json" }, idem: { tool: "charge", sleep } }));
  await send(JSON.stringify({ amount_cents: 100 }));
  await send(JSON.stringify({ amount_cents: 200 }));
  assert.notEqual(seen[0].key, seen[1].key, "two bodies, two keys");
  await send(JSON.stringify({ amount_cents: 100 }));
  assert.equal(seen[2].key, seen[0].key);
  await assert.rejects(send("a=1"), /not one/);
  await assert.rejects(
    withScope("run-60b", () => idemFetch(url, { method: "POST", body: "{}", idem: { tool: "charge", args: { a: 1 }, sleep } })),
    /not both/,
  );
  assert.equal(seen.length, 3, "nothing sent for a refused call");
});
