// idempotent(fn) over the native engine: replays, errors, the scope context, typed errors, and
// races between worker threads and processes, on memory, SQLite, Redis and PostgreSQL stores.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { Worker } from "node:worker_threads";

import {
  ConfigurationError,
  IdemError,
  InFlightError,
  KeyDerivationError,
  KeyMismatchError,
  OutcomeUnknownError,
  ResultTooLargeError,
  Scope,
  ScopeMissingError,
  StoreUnavailableError,
  ToolArgumentsError,
  currentScope,
  deriveKey,
  idempotent,
  withScope,
} from "../index.js";
import { REDIS, idemBinary, inspect, postgres, rows, tmp } from "./helpers.mjs";

const run = promisify(execFile);

function counter() {
  const calls = [];
  const fn = async (args) => {
    calls.push(args);
    return { n: calls.length, echo: args };
  };
  return { fn, calls };
}

let unique = 0;
const memory = () => `memory:`; // one memory store per process: distinct scopes keep tests apart
const scopeId = (name) => `${name}-${process.pid}-${++unique}`;

test("a repeated call replays the first result; the function runs once", async () => {
  const { fn, calls } = counter();
  const charge = idempotent(fn, { tool: "charge", store: memory() });
  await withScope(scopeId("replay"), async () => {
    const a = await charge({ amount: 5 });
    const b = await charge({ amount: 5 });
    const c = await charge({ amount: 6 });
    assert.deepEqual(a, { n: 1, echo: { amount: 5 } });
    assert.deepEqual(b, a);
    assert.equal(c.n, 2);
  });
  assert.equal(calls.length, 2);
});

test("callWithOutcome says whether the call ran or replayed, with its key, on memory and SQLite", async (t) => {
  for (const store of [memory(), `sqlite:${join(tmp(t), "outcome.db")}`]) {
    const { fn, calls } = counter();
    const charge = idempotent(fn, { tool: "charge", store });
    const scope = scopeId("outcome");
    await withScope(scope, async () => {
      const first = await charge.callWithOutcome({ amount: 5 });
      const again = await charge.callWithOutcome({ amount: 5 });
      const key = deriveKey(scope, "charge", { amount: 5 });
      assert.deepEqual(first, { value: { n: 1, echo: { amount: 5 } }, outcome: { key, replayed: false, attempts: 1, replays: 0, saved: "stored" } });
      // The store's count of replays (SQLite counts them in batches, so it may lag).
      const { replays, ...rest } = again.outcome;
      assert.deepEqual({ value: again.value, outcome: rest }, { value: first.value, outcome: { key, replayed: true, attempts: 1, saved: "stored" } });
      assert.ok(Number.isInteger(replays) && replays >= 0, `${replays}`);
      // The plain call is unchanged: the value alone.
      assert.deepEqual(await charge({ amount: 5 }), first.value);
    });
    assert.equal(calls.length, 1, store);
  }
});

test("a thrown error releases the key by default; keepErrors stores and replays it", async () => {
  let n = 0;
  const flaky = idempotent(async () => {
    n++;
    if (n === 1) throw new Error("transient");
    return n;
  }, { tool: "flaky", store: memory() });
  await withScope(scopeId("release"), async () => {
    await assert.rejects(flaky({}), /transient/);
    assert.equal(await flaky({}), 2);
  });

  class Declined extends Error {
    name = "Declined";
  }
  let m = 0;
  const card = idempotent(async () => {
    m++;
    throw new Declined("card declined");
  }, { tool: "card", store: memory(), keepErrors: [Declined] });
  await withScope(scopeId("keep"), async () => {
    await assert.rejects(card({}), Declined);
    await assert.rejects(card({}), (e) => e instanceof Declined && e.name === "Declined" && e.message === "card declined" && e.replayed === true);
  });
  assert.equal(m, 1);
});

test("a kept error replays as its keepErrors class, matched by name; a class it cannot build gives a named Error", async () => {
  class Unnamed extends Error {} // no name of its own: kept under its class's name
  class Picky extends Error {
    constructor(message, code) {
      if (code === undefined) throw new TypeError("Picky needs a code");
      super(message);
      this.name = "Picky";
    }
  }
  const errors = [new Unnamed("no funds"), new Picky("too picky", 7), Object.assign(new Error("by name"), { name: "Named" })];
  const ran = [];
  for (const err of errors) {
    const t = idempotent(async () => {
      ran.push(err);
      throw err;
    }, { tool: "kept", store: memory(), keepErrors: [Unnamed, Picky, "Named"] });
    await withScope(scopeId("rebuild"), async () => {
      await assert.rejects(t({}), (e) => e === err);
      await assert.rejects(t({}), (e) => e !== err && e.replayed === true && e.message === err.message && e.name === err.name);
    });
  }
  assert.equal(ran.length, 3);
  await withScope(scopeId("rebuild-classes"), async () => {
    const unnamed = idempotent(async () => { throw new Unnamed("again"); }, { tool: "u", store: memory(), keepErrors: [Unnamed] });
    await assert.rejects(unnamed({}), Unnamed);
    await assert.rejects(unnamed({}), (e) => e instanceof Unnamed && e.replayed === true);
    const picky = idempotent(async () => { throw new Picky("again", 1); }, { tool: "p", store: memory(), keepErrors: [Picky] });
    await assert.rejects(picky({}), Picky);
    await assert.rejects(picky({}), (e) => !(e instanceof Picky) && e instanceof Error && e.name === "Picky" && e.replayed === true);
  });
});

test("only the first argument is keyed: a call whose first argument is not a plain object is refused before it runs", async () => {
  const { fn, calls } = counter();
  const pay = idempotent(fn, { tool: "pay", store: memory(), scope: scopeId("positional") });
  for (const first of ["cus_1", 4900, null, undefined, ["cus_1", 4900], new Date(0), new (class Args {})()]) {
    await assert.rejects(pay(first, 9900), (e) =>
      e instanceof ToolArgumentsError && e instanceof KeyDerivationError && e instanceof IdemError &&
      /keys a call on its first argument/.test(e.message) && /fn\(\{ customer, amount \}\)/.test(e.message));
  }
  assert.equal(calls.length, 0);
  // A plain object, or one without a prototype, is the arguments; what follows is not keyed.
  assert.deepEqual((await pay({ customer: "cus_1", amount: 4900 }, { toolCallId: "a" })).n, 1);
  assert.deepEqual((await pay({ customer: "cus_1", amount: 4900 }, { toolCallId: "b" })).n, 1);
  assert.deepEqual((await pay(Object.assign(Object.create(null), { customer: "cus_1", amount: 9900 }))).n, 2);
  assert.deepEqual((await pay()).n, 3); // no arguments at all: keyed as null
});

test("arguments that are not JSON and a mistyped store URL are typed errors; nothing runs", async () => {
  const { fn, calls } = counter();
  const t = idempotent(fn, { tool: "t", store: memory(), scope: scopeId("json") });
  const cyclic = { a: 1 };
  cyclic.self = cyclic;
  await assert.rejects(t({ amount: 10n }), (e) => e instanceof KeyDerivationError && /BigInt/.test(e.message));
  await assert.rejects(t(cyclic), (e) => e instanceof KeyDerivationError && /circular/i.test(e.message));
  await assert.rejects(t({ id: 2 ** 60 }), (e) => e instanceof KeyDerivationError && /2\^53/.test(e.message));
  const typo = idempotent(fn, { tool: "t", store: "postgress://localhost/db", scope: "s" });
  await assert.rejects(typo({}), (e) => e instanceof ConfigurationError && e instanceof IdemError && /unknown scheme "postgress"/.test(e.message));
  assert.equal(calls.length, 0);
});

test("the scope comes from the option, a function of the arguments, or the context; never invented", async () => {
  const { fn } = counter();
  const t = idempotent(fn, { tool: "t", store: memory() });
  await assert.rejects(t({ a: 1 }), ScopeMissingError);
  const byArgs = idempotent(fn, { tool: "t", store: memory(), scope: (args) => `order-${args.order}` });
  const first = await byArgs({ order: scopeId("o") });
  assert.deepEqual(await byArgs(first.echo), first);

  const scope = new Scope(scopeId("handoff"));
  const json = JSON.stringify(scope);
  assert.deepEqual(JSON.parse(json), { format: "idem-scope/v1", id: scope.id });
  assert.equal(Scope.from(JSON.stringify({ idem_scope: scope.id })).id, scope.id, "the older form still reads");
  assert.equal(Scope.from(json).id, scope.id);
  assert.equal(Scope.from(JSON.parse(json)).id, scope.id);
  await withScope(scope, async () => {
    await new Promise((r) => setTimeout(r, 1));
    assert.equal(currentScope().id, scope.id, "the scope survives awaits and timers");
  });
  assert.equal(currentScope(), undefined);
  assert.throws(() => new Scope(""), TypeError);
});

test("an idempotency_key in the arguments is neither the key nor the intent: the runtime's key is (issue 60)", async () => {
  const { fn, calls } = counter();
  const run = scopeId("explicit");
  const t = idempotent(fn, { tool: "explicit", store: memory(), scope: run });
  const a = await t({ idempotency_key: "k-model-1", x: 1 });
  assert.deepEqual(await t({ idempotency_key: "k-model-2", x: 1 }), a);
  assert.deepEqual(await t({ x: 1 }), a);
  assert.equal(calls.length, 1);
  assert.equal(calls[0].idempotency_key, deriveKey(run, "explicit", { x: 1 }));
});

test("a duplicate while the first is running: waits for its result, or with wait 0 is told it is in flight", async () => {
  let release;
  const gate = new Promise((r) => (release = r));
  let runs = 0;
  const slow = async () => {
    runs++;
    await gate;
    return "done";
  };
  const waiting = idempotent(slow, { tool: "slow", store: memory() });
  const impatient = idempotent(slow, { tool: "slow", store: memory(), wait: null });
  await withScope(scopeId("inflight"), async () => {
    const first = waiting({});
    await new Promise((r) => setTimeout(r, 50));
    await assert.rejects(impatient({}), (e) => e instanceof InFlightError && e instanceof IdemError && typeof e.key === "string");
    const second = waiting({});
    release();
    assert.deepEqual(await Promise.all([first, second]), ["done", "done"]);
  });
  assert.equal(runs, 1);
});

test("a result that cannot be encoded marks the key outcome-unknown; a retry is refused until resolved", async () => {
  let runs = 0;
  const t = idempotent(async () => {
    runs++;
    return { big: 10n };
  }, { tool: "unencodable", store: memory() });
  await withScope(scopeId("unknown"), async () => {
    await assert.rejects(t({}), /could not be encoded/);
    await assert.rejects(t({}), (e) => e instanceof OutcomeUnknownError && /idem resolve/.test(e.message));
  });
  assert.equal(runs, 1);
});

test("a result over maxResultBytes is returned once and cannot be replayed", async () => {
  const t = idempotent(async () => "x".repeat(100), { tool: "big", store: memory(), maxResultBytes: 10 });
  await withScope(scopeId("big"), async () => {
    assert.equal((await t({})).length, 100);
    await assert.rejects(t({}), ResultTooLargeError);
  });
});

test("bad declarations fail when wrapping; an unusable store fails closed", async () => {
  assert.throws(() => idempotent(async () => 1), /no name/);
  assert.throws(() => idempotent(async function t() {}, { keyfields: ["a"] }), /unknown option keyfields/);
  assert.throws(() => idempotent(async function t() {}, { lease: 1 }), /lease/);
  assert.throws(() => idempotent(async function t() {}, { onAbandoned: "maybe" }), ConfigurationError);
  assert.throws(() => idempotent(async function t() {}, { keyFields: ["a..b"] }), /malformed/);
  let ran = false;
  const t = idempotent(async () => (ran = true), { tool: "t", store: "postgres://postgres@127.0.0.1:1/none", scope: "s" });
  await assert.rejects(t({}), StoreUnavailableError);
  assert.equal(ran, false);
});

test("a SQLite store: `idem inspect` shows the record of the key the package derived", async (t) => {
  const dir = tmp(t);
  const store = `sqlite:${join(dir, "idem.db")}`;
  const fn = idempotent(async ({ customer }) => ({ ok: customer }), { tool: "add_row", store });
  await withScope("run-inspect", () => fn({ customer: "c1" }));
  const key = deriveKey("run-inspect", "add_row", { customer: "c1" });
  const shown = inspect(key, store);
  assert.match(shown, /completed/);
  assert.match(shown, /200/);
});

// Each run in a schema / key prefix of its own, deleted afterwards.
const pgSchema = `idem_node_${process.pid}`;
const redisPrefix = `idem-node-test-${process.pid}`;
for (const [name, store, cleanup] of [
  ["redis", `${REDIS}&prefix=${redisPrefix}`, () => run("redis-cli", ["-h", "127.0.0.1", "eval", "for _, p in ipairs(ARGV) do for _, k in ipairs(redis.call('keys', p)) do redis.call('del', k) end end", "0", `${redisPrefix}:*`, `${redisPrefix}#*`])],
  ["postgres", postgres(pgSchema), () => run("psql", ["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-c", `DROP SCHEMA IF EXISTS ${pgSchema} CASCADE`])],
]) {
  test(`a ${name} store replays`, async (t) => {
    t.after(cleanup);
    const { fn, calls } = counter();
    const t1 = idempotent(fn, { tool: "remote", store });
    await withScope(scopeId(name), async () => {
      const a = await t1({ v: 1 });
      assert.deepEqual(await t1({ v: 1 }), a);
    });
    assert.equal(calls.length, 1);
  });
}

// SQLite's calls run on libuv's pool, Redis's as tasks on idem's runtime that settle each
// worker thread's promise from that runtime's threads (src/tool.rs, Lane).
const dropRedisKeys = (prefix) => () =>
  run("redis-cli", ["-h", "127.0.0.1", "eval", "for _, p in ipairs(ARGV) do for _, k in ipairs(redis.call('keys', p)) do redis.call('del', k) end end", "0", `${prefix}:*`, `${prefix}#*`]);
for (const [name, storeIn, cleanup] of [
  ["SQLite", (dir) => `sqlite:${join(dir, "idem.db")}`, () => {}],
  ["Redis", () => `${REDIS}&prefix=${redisPrefix}-race`, dropRedisKeys(`${redisPrefix}-race`)],
]) {
test(`${name}: worker threads and two processes racing one intent: one effect, one result for all`, async (t) => {
  t.after(cleanup);
  const dir = tmp(t);
  const db = join(dir, "effects.db");
  rows(db); // the table exists before the racers start
  const store = storeIn(dir);
  const scope = new Scope(scopeId(`race-${name}`));
  const job = (who) => ({ who, scope: scope.toJSON(), store, db, customer: "cus_race" });
  const racer = new URL("./racer.mjs", import.meta.url);
  const threads = [1, 2, 3].map(
    (i) =>
      new Promise((resolve, reject) => {
        const w = new Worker(racer, { workerData: job(`thread-${i}`) });
        w.once("message", resolve);
        w.once("error", reject);
      }),
  );
  const procs = [1, 2].map((i) =>
    run(process.execPath, [racer.pathname, JSON.stringify(job(`process-${i}`))]).then((r) => JSON.parse(r.stdout)),
  );
  const results = await Promise.all([...threads, ...procs]);
  assert.equal(rows(db).count(), 1, "exactly one row");
  for (const r of results) assert.deepEqual(r, results[0]);
  assert.match(inspect(deriveKey(scope.id, "add_row", { customer: "cus_race" }), store), /completed/);
  assert.ok(idemBinary());
});
}
