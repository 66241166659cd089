// idemFetch through the real gateway (`idem serve` in front of `idem example-api`, the
// deliberately non-idempotent payment API): the first reply is lost after the charge was made,
// idemFetch retries with the same key, the gateway replays, and the card is charged once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { deriveKey, idemFetch, withScope } from "../index.js";
import { requestIntent } from "../fetch.js";
import { idemBinary, tmp } from "./helpers.mjs";

/** Starts `idem ARGS` (killed when the test ends) and returns its first line of output. */
async function start(t, args) {
  const child = spawn(idemBinary(), args, { stdio: ["ignore", "pipe", "pipe"] });
  t.after(() => child.kill("SIGKILL"));
  const exited = new Promise((_, reject) => child.once("exit", (code) => reject(new Error(`idem ${args[0]} exited (${code})`))));
  const first = async (stream) => {
    for await (const line of createInterface({ input: stream })) return line;
    return "";
  };
  return Promise.race([first(child.stdout), first(child.stderr), exited]);
}

test("a reply lost after the charge: idemFetch's retry through idem serve is replayed, one charge", async (t) => {
  const dir = tmp(t);
  const apiLine = await start(t, ["example-api", "--listen", "127.0.0.1:0", "--db", join(dir, "charges.db")]);
  const api = apiLine.match(/http:\/\/[^\s;]+/)?.[0];
  assert.ok(api, apiLine);
  const gwLine = await start(t, [
    "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--upstream", api, "--store", `sqlite:${join(dir, "idem.db")}`,
  ]);
  const gw = gwLine.match(/listening on ([\d.:]+)/)?.[1];
  assert.ok(gw, gwLine);

  let lost = false;
  const attempts = [];
  // The network loses the first reply after the gateway and the API did their work.
  const lossyFetch = async (input, init) => {
    const res = await fetch(input, init);
    await res.arrayBuffer();
    if (!lost) {
      lost = true;
      throw new TypeError("fetch failed", { cause: Object.assign(new Error("socket hang up"), { code: "ECONNRESET" }) });
    }
    return new Response(JSON.stringify({ replayed: res.headers.get("idempotent-replayed") }), { status: res.status });
  };
  const args = { customer_id: "cus_gw", amount_cents: 4900 };
  const res = await withScope("run-gw-1", () =>
    idemFetch(`http://${gw}/v1/charges`, {
      headers: { authorization: "Bearer agent-1" },
      idem: { tool: "create_charge", args, fetch: lossyFetch, sleep: async () => {}, onAttempt: (a) => attempts.push(a) },
    }),
  );
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { replayed: "true" });
  assert.equal(attempts.length, 2);
  const key = deriveKey("run-gw-1", "create_charge", JSON.parse(requestIntent(`http://${gw}/v1/charges`, "POST", args)));
  assert.ok(attempts.every((a) => a.key === key));
  const charges = await (await fetch(`${api.replace(/\/$/, "")}/v1/charges`)).json();
  assert.equal(charges.data.length, 1, JSON.stringify(charges));
});
