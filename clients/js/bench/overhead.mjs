// Per-call overhead of idempotent() on memory, SQLite and Redis stores: new keys (claim, run,
// store) and replays (claim answered from the store), beside the undecorated call.
// Run: node clients/js/bench/overhead.mjs [calls] [rounds]   (after npm install; Redis on 127.0.0.1:6379)
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { idempotent, withScope } from "../index.js";

const calls = Number(process.argv[2] ?? 5000);
const dir = mkdtempSync(join(tmpdir(), "idem-bench-"));
const redisPrefix = `idem-node-bench-${process.pid}`;
const stores = {
  memory: "memory:",
  sqlite: `sqlite:${join(dir, "bench.db")}`,
  // A key prefix of its own, deleted at the end.
  redis: `redis://127.0.0.1:6379/?durability=volatile&prefix=${redisPrefix}`,
};

const work = async ({ i }) => ({ ok: true, i });

async function time(n, f) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await f(i);
  return Number(process.hrtime.bigint() - start) / 1000 / n; // µs per call
}

// Each measurement is taken in `rounds` rounds (new keys each round); the table shows the
// median and the best round, since other processes on a shared machine only ever add time.
const rounds = Number(process.argv[3] ?? 5);
const stats = (xs) => {
  const v = [...xs].sort((a, b) => a - b);
  return { median: v[Math.floor(v.length / 2)], best: v[0] };
};
const fmt = ({ median, best }) => `${median.toFixed(1)} (${best.toFixed(1)})`;

const rows = [];
const plainRuns = [];
for (let r = 0; r < rounds; r++) plainRuns.push(await time(calls, (i) => work({ i })));
const plain = stats(plainRuns).median;
rows.push(["(undecorated)", fmt(stats(plainRuns)), "", ""]);
for (const [name, url] of Object.entries(stores)) {
  const n = name === "memory" ? calls : Math.min(calls, 2000);
  const tool = idempotent(work, { tool: "bench", store: url });
  const fresh = [];
  const replay = [];
  for (let r = 0; r < rounds; r++) {
    await withScope(`bench-${process.pid}-${name}-${r}`, async () => {
      await tool({ i: -1 }); // open the store
      fresh.push((await time(n, (i) => tool({ i }))) - plain);
      replay.push((await time(n, (i) => tool({ i }))) - plain);
    });
  }
  rows.push([name, "", fmt(stats(fresh)), fmt(stats(replay))]);
}
rmSync(dir, { recursive: true, force: true });
// The store's keys are `<prefix>:...` and `<prefix>#...`: exactly this run's.
execFileSync("redis-cli", ["-h", "127.0.0.1", "eval", "for _, p in ipairs(ARGV) do for _, k in ipairs(redis.call('keys', p)) do redis.call('del', k) end end", "0", `${redisPrefix}:*`, `${redisPrefix}#*`]);
console.log(`node ${process.version}, ${rounds} rounds of ${calls} calls (SQLite and Redis: ${Math.min(calls, 2000)}); median (best round), µs per call`);
console.log("| store | undecorated call | overhead, new key | overhead, replay |");
console.log("|---|---|---|---|");
for (const r of rows) console.log(`| ${r.join(" | ")} |`);
