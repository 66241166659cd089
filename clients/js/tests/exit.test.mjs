// A process that used a SQLite store and exits leaves the store as one complete file: the
// package closes its stores on Node's `exit` event, so no -wal or -shm stays beside idem.db,
// and the file alone answers the next process's replay.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";

import { tmp } from "./helpers.mjs";

const run = promisify(execFile);
const index = new URL("../index.js", import.meta.url).href;

const SCRIPT = `
import { idempotent, withScope } from ${JSON.stringify(index)};
let charges = 0;
const charge = idempotent(async ({ customer, amountCents }) => {
  charges += 1;
  return { charge: "ch_" + customer };
}, { tool: "charge_card", store: process.argv[1] });
await withScope("order-123", async () => {
  for (const customer of ["cus_1", "cus_2", "cus_1"]) {
    await charge({ customer, amountCents: 4900 });
  }
});
console.log(JSON.stringify({ charges }));
`;

async function charges(store) {
  const { stdout } = await run(process.execPath, ["--input-type=module", "-e", SCRIPT, store]);
  return JSON.parse(stdout).charges;
}

test("a SQLite store is one complete file after the process exits", async (t) => {
  const dir = tmp(t);
  const path = join(dir, "idem.db");
  assert.equal(await charges(`sqlite:${path}`), 2);
  assert.deepEqual(readdirSync(dir).sort(), ["idem.db"]);
  // The file alone, copied elsewhere, answers the replays.
  const other = tmp(t);
  copyFileSync(path, join(other, "idem.db"));
  assert.equal(await charges(`sqlite:${join(other, "idem.db")}`), 0);
});

test("a worker thread that ends does not close the process's stores", async (t) => {
  const dir = tmp(t);
  const store = `sqlite:${join(dir, "idem.db")}`;
  const { idempotent, withScope } = await import("../index.js");
  const { Worker } = await import("node:worker_threads");
  const worker = new Worker(
    `import(${JSON.stringify(index)}).then(async ({ idempotent, withScope }) => {
       const f = idempotent(async ({ n }) => n, { tool: "in_worker", store: ${JSON.stringify(store)} });
       await withScope("worker", () => f({ n: 1 }));
     });`,
    { eval: true },
  );
  await new Promise((resolve, reject) => {
    worker.once("exit", resolve);
    worker.once("error", reject);
  });
  let ran = 0;
  const f = idempotent(async ({ n }) => { ran += 1; return n; }, { tool: "after_worker", store });
  assert.equal(await withScope("main", () => f({ n: 2 })), 2);
  assert.equal(ran, 1);
});
