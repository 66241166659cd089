// Adversarial: more duplicates of one call in flight, in one process, than libuv's thread pool
// has threads (UV_THREADPOOL_SIZE, 4 by default). When `begin` and `finish` ran on that pool
// (AsyncTasks) only, each waiting duplicate held a pool thread and the first call's `finish` queued
// behind them: the result was stored only when their wait ran out, and they failed with
// InFlightError. A waiting `begin` now runs as a task on idem's runtime and holds no thread
// (src/tool.rs, begin_waiting), on a store whose other calls use the pool (SQLite) and on one
// whose calls all run on the runtime (Redis).
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { idempotent } from "../index.js";
import { REDIS, tmp } from "./helpers.mjs";

const stores = {
  SQLite: (t) => `sqlite:${join(tmp(t), "idem.db")}`,
  // Records expire with their retention; the prefix is this run's.
  Redis: () => `${REDIS}&prefix=idem-node-attack-${process.pid}`,
};

for (const [name, storeOf] of Object.entries(stores)) {
test(
  `${name}: duplicates beyond libuv's pool size all get the first call's result`,
  async (t) => {
    const ran = [];
    const op = idempotent(
      async (a) => {
        ran.push(a);
        await new Promise((r) => setTimeout(r, 200));
        return a.x;
      },
      { tool: "op", store: storeOf(t), scope: `s${process.pid}-${Date.now()}`, wait: 3000 },
    );
    const pool = Number(process.env.UV_THREADPOOL_SIZE ?? 4);
    const first = op({ x: 1 });
    await new Promise((r) => setTimeout(r, 50)); // the first call is running
    const duplicates = Array.from({ length: pool + 4 }, () => op({ x: 1 }));
    const results = await Promise.allSettled([first, ...duplicates]);
    assert.equal(ran.length, 1);
    assert.deepEqual(
      results.filter((r) => r.status !== "fulfilled" || r.value !== 1).map((r) => r.reason?.name),
      [],
    );
  },
);
}
