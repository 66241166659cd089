// Adversarial: more duplicates of one call in flight, in one process, than libuv's thread pool
// has threads (UV_THREADPOOL_SIZE, 4 by default). Each duplicate waiting for the call holds a
// pool thread (its `begin` is an AsyncTask), and the first call's `finish` is an AsyncTask on
// the same pool, queued behind them: the result is stored only when their wait runs out, and
// every one of them fails with InFlightError. Known, not fixed yet (the finish needs a thread
// of its own, or the wait must not hold a pool thread): marked todo so the run stays green.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { idempotent } from "../index.js";
import { tmp } from "./helpers.mjs";

test(
  "duplicates beyond libuv's pool size all get the first call's result",
  { todo: "libuv pool starvation: waiting duplicates block the first call's finish" },
  async (t) => {
    const ran = [];
    const op = idempotent(
      async (a) => {
        ran.push(a);
        await new Promise((r) => setTimeout(r, 200));
        return a.x;
      },
      { tool: "op", store: `sqlite:${join(tmp(t), "idem.db")}`, scope: `s${Date.now()}`, wait: 3000 },
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
