// Per-call overhead of idempotent() on memory, SQLite and Redis stores: new keys (claim, run,
// store) and replays (claim answered from the store), beside the undecorated call.
// Run: node clients/js/bench/overhead.mjs [calls]   (after npm install; Redis on 127.0.0.1:6379)
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { idempotent, withScope } from "../index.js";

const calls = Number(process.argv[2] ?? 5000);
const dir = mkdtempSync(join(tmpdir(), "idem-bench-"));
const stores = {
  memory: "memory:",
  sqlite: `sqlite:${join(dir, "bench.db")}`,
  redis: "redis://127.0.0.1:6379/?durability=volatile",
};

const work = async ({ i }) => ({ ok: true, i });

async function time(n, f) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await f(i);
  return Number(process.hrtime.bigint() - start) / 1000 / n; // µs per call
}

const rows = [];
const plain = await time(calls, (i) => work({ i }));
rows.push(["(undecorated)", plain.toFixed(2), "", ""]);
for (const [name, url] of Object.entries(stores)) {
  const n = name === "memory" ? calls : Math.min(calls, 2000);
  const tool = idempotent(work, { tool: "bench", store: url });
  await withScope(`bench-${process.pid}-${name}`, async () => {
    await tool({ i: -1 }); // open the store
    const fresh = await time(n, (i) => tool({ i }));
    const replay = await time(n, (i) => tool({ i }));
    rows.push([name, "", (fresh - plain).toFixed(1), (replay - plain).toFixed(1)]);
  });
}
rmSync(dir, { recursive: true, force: true });
console.log(`node ${process.version}, ${calls} calls (SQLite and Redis: ${Math.min(calls, 2000)})`);
console.log("| store | undecorated (µs/call) | new key overhead (µs/call) | replay overhead (µs/call) |");
console.log("|---|---|---|---|");
for (const r of rows) console.log(`| ${r.join(" | ")} |`);
