// Checks an installed idem-runtime (`npm install ./clients/js` in an empty directory): copy this
// file there and run it with node. It imports the package by name, runs one tool twice on a
// SQLite store, and fails unless the second call replays the first.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { deriveKey, idempotent, withScope } from "idem-runtime";
import { derive } from "idem-runtime/key";

const dir = mkdtempSync(join(tmpdir(), "idem-smoke-"));
try {
  let runs = 0;
  const charge = idempotent(async ({ amount }) => ({ charged: amount, run: ++runs }), {
    tool: "charge_card",
    store: `sqlite:${join(dir, "idem.db")}`,
  });
  const [a, b] = await withScope("smoke", async () => [await charge({ amount: 5 }), await charge({ amount: 5 })]);
  assert.deepEqual(a, { charged: 5, run: 1 });
  assert.deepEqual(b, a);
  assert.equal(runs, 1);
  assert.equal(deriveKey("smoke", "charge_card", { amount: 5 }), derive("smoke", "charge_card", { amount: 5 }));
  console.log("idem-runtime installed and working: one run, one replay");
} finally {
  rmSync(dir, { recursive: true, force: true });
}
