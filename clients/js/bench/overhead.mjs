// Per-call overhead of idempotent() on memory, SQLite and Redis stores: new keys (claim, run,
// store) and replays (claim answered from the store), beside the undecorated call.
// Run: node clients/js/bench/overhead.mjs [calls] [rounds]   (after npm install; Redis on 127.0.0.1:6379)
// Beside the time, the CPU per call: this process's (every thread: libuv's pool and idem's
// runtime count) and, on Redis, the server's (its /proc ticks). On a shared 2-core machine a
// time moves with the machine; CPU per call moves much less.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
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

// The local Redis server's process id, for its CPU (none when it is not on this machine).
const redisPid = (() => {
  const info = execFileSync("redis-cli", ["-h", "127.0.0.1", "info", "server"]).toString();
  const pid = /process_id:(\d+)/.exec(info)?.[1];
  return pid && existsSync(`/proc/${pid}/stat`) ? pid : null;
})();
const ticks = Number(execFileSync("getconf", ["CLK_TCK"]).toString()) || 100;
// User + system CPU of the Redis server so far, in µs.
const serverCpu = () => {
  if (!redisPid) return 0;
  const f = readFileSync(`/proc/${redisPid}/stat`, "utf8").split(") ")[1].split(" ");
  return ((Number(f[11]) + Number(f[12])) / ticks) * 1e6;
};

// µs per call: time, this process's CPU, the Redis server's CPU (when `server`).
async function time(n, f, server = false) {
  const [s0, c0, start] = [server ? serverCpu() : 0, process.cpuUsage(), process.hrtime.bigint()];
  for (let i = 0; i < n; i++) await f(i);
  const wall = Number(process.hrtime.bigint() - start) / 1000 / n;
  const c = process.cpuUsage(c0);
  return { wall, cpu: (c.user + c.system) / n, server: server ? (serverCpu() - s0) / n : 0 };
}

// Each measurement is taken in `rounds` rounds (new keys each round); the table shows the
// median and the best round, since other processes on a shared machine only ever add time.
const rounds = Number(process.argv[3] ?? 5);
const stats = (xs) => {
  const v = [...xs].sort((a, b) => a - b);
  return { median: v[Math.floor(v.length / 2)], best: v[0] };
};
const fmt = ({ median, best }) => `${median.toFixed(1)} (${best.toFixed(1)})`;
// The median round's CPU per call (process, + server when measured).
const fmtCpu = (runs) => {
  const m = [...runs].sort((a, b) => a.wall - b.wall)[Math.floor(runs.length / 2)];
  return m.cpu.toFixed(1) + (m.server ? ` + ${m.server.toFixed(1)}` : "");
};

const rows = [];
const plainRuns = [];
for (let r = 0; r < rounds; r++) plainRuns.push((await time(calls, (i) => work({ i }))).wall);
const plain = stats(plainRuns).median;
rows.push(["(undecorated)", fmt(stats(plainRuns)), "", "", "", ""]);
for (const [name, url] of Object.entries(stores)) {
  const n = name === "memory" ? calls : Math.min(calls, 2000);
  const tool = idempotent(work, { tool: "bench", store: url });
  const fresh = [];
  const replay = [];
  for (let r = 0; r < rounds; r++) {
    await withScope(`bench-${process.pid}-${name}-${r}`, async () => {
      await tool({ i: -1 }); // open the store
      fresh.push(await time(n, (i) => tool({ i }), name === "redis"));
      replay.push(await time(n, (i) => tool({ i }), name === "redis"));
    });
  }
  const over = (runs) => fmt(stats(runs.map((x) => x.wall - plain)));
  rows.push([name, "", over(fresh), fmtCpu(fresh), over(replay), fmtCpu(replay)]);
}
rmSync(dir, { recursive: true, force: true });
// The store's keys are `<prefix>:...` and `<prefix>#...`: exactly this run's.
execFileSync("redis-cli", ["-h", "127.0.0.1", "eval", "for _, p in ipairs(ARGV) do for _, k in ipairs(redis.call('keys', p)) do redis.call('del', k) end end", "0", `${redisPrefix}:*`, `${redisPrefix}#*`]);
console.log(`node ${process.version}, ${rounds} rounds of ${calls} calls (SQLite and Redis: ${Math.min(calls, 2000)}); median (best round), µs per call`);
console.log("CPU: this process's (all threads) + the Redis server's, µs per call, in the median round");
console.log("| store | undecorated call | overhead, new key | new key CPU | overhead, replay | replay CPU |");
console.log("|---|---|---|---|---|---|");
for (const r of rows) console.log(`| ${r.join(" | ")} |`);
