// Issue 60: the runtime side keys exactly the intent. Different intents never share a key (a
// value JSON would coerce is refused, the request's target is keyed, a model-written key is
// never the key), and one intent keeps one key (written another way, in another language).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { DeriveError, KeyDerivationError, Scope, deriveKey, idempotent, withScope } from "../index.js";
import { requestIntent } from "../fetch.js";
import { intentJson } from "../intent.js";

/** A real store, a file of its own: the high cases show one execution per intent there. */
const sqlite = () => `sqlite:${join(mkdtempSync(join(tmpdir(), "idem-intent-")), "idem.db")}`;

class Card {
  #number;
  constructor(number) {
    this.#number = number;
  }
}

test("values JSON would coerce are refused, naming where they are (items 1, 6)", async () => {
  const refused = [
    [{ skus: new Set(["sku_1"]) }, "arguments.skus: a Set"],
    [{ by: new Map([["a", 1]]) }, "arguments.by: a Map"],
    [{ customer: Promise.resolve("cus_2") }, "a Promise (a missing await?)"],
    [{ why: new Error("x") }, "arguments.why: an Error"],
    [{ match: /a/ }, "arguments.match: a RegExp"],
    [{ card: new Card("4242") }, "arguments.card: a Card"],
    [{ amount: NaN }, "arguments.amount is NaN"],
    [{ amount: Infinity }, "arguments.amount is Infinity"],
    [{ amount: -Infinity }, "arguments.amount is -Infinity"],
    [{ when: new Date("x") }, "an invalid Date"],
    [{ cb: () => 1 }, "a function"],
    [{ s: Symbol("s") }, "a symbol"],
    [{ raw: Buffer.from("a") }, "bytes"],
    [{ raw: new Uint8Array([1]) }, "bytes"],
    [{ items: [1, , 3] }, "arguments.items[1]: a hole"],
    [{ items: [undefined] }, "arguments.items[0]: undefined"],
    [{ n: 10n }, "a BigInt"],
  ];
  for (const [args, why] of refused) {
    assert.throws(() => intentJson(args), (e) => e instanceof KeyDerivationError && e.message.includes(why.split(": ").pop()), why);
    assert.throws(() => deriveKey("run_1", "ship", args), DeriveError, why);
  }
  const cyclic = { a: {} };
  cyclic.a.b = cyclic;
  assert.throws(() => intentJson(cyclic), /arguments\.a\.b is a circular reference/);

  // Nothing ran for a refused call.
  let runs = 0;
  const ship = idempotent(async (args) => ++runs, { tool: "ship", store: sqlite(), scope: "run_ship" });
  await assert.rejects(ship({ order: "o1", skus: new Set(["sku_1"]) }), KeyDerivationError);
  assert.equal(runs, 0);
});

test("what JSON carries as it is keeps JSON's meaning", () => {
  const when = new Date("2026-12-08T00:00:00Z");
  assert.equal(intentJson({ a: 1, b: "x", c: [true, null], d: when, e: undefined }), JSON.stringify({ a: 1, b: "x", c: [true, null], d: when }));
  assert.equal(intentJson({ money: { toJSON: undefined, v: 1 } }), '{"money":{"v":1}}');
  class Money {
    constructor(cents) {
      this.cents = cents;
    }
    toJSON() {
      return { cents: this.cents };
    }
  }
  assert.equal(intentJson({ m: new Money(5) }), '{"m":{"cents":5}}');
  // An object member written in another order is one intent.
  assert.equal(deriveKey("run_1", "charge", { a: 1, b: 2 }), deriveKey("run_1", "charge", { b: 2, a: 1 }));
});

test("different intents, different keys; one intent written another way, one key (a property over random values)", () => {
  let seed = 60;
  const rand = () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
  const value = (depth) => {
    const r = rand();
    if (depth > 2 || r < 0.3) return Math.floor(rand() * 1000);
    if (r < 0.5) return `s${Math.floor(rand() * 1000)}`;
    if (r < 0.6) return rand() < 0.5;
    if (r < 0.8) return Array.from({ length: Math.floor(rand() * 3) }, () => value(depth + 1));
    return Object.fromEntries(Array.from({ length: Math.floor(rand() * 3) }, (_, i) => [`k${i}`, value(depth + 1)]));
  };
  const reorder = (v) =>
    Array.isArray(v) ? v.map(reorder) : v && typeof v === "object" ? Object.fromEntries(Object.entries(v).reverse().map(([k, x]) => [k, reorder(x)])) : v;
  const seen = new Map();
  for (let i = 0; i < 400; i++) {
    const args = { v: value(0) };
    const text = JSON.stringify(args);
    const key = deriveKey("run_p", "tool", args);
    assert.equal(deriveKey("run_p", "tool", reorder(args)), key, text);
    if (seen.has(key)) assert.equal(seen.get(key), text, "two different intents shared a key");
    seen.set(key, text);
    // Another scope, tool or method/URL: another key.
    assert.notEqual(deriveKey("run_q", "tool", args), key);
    assert.notEqual(deriveKey("run_p", "tool2", args), key);
  }
});

test("the runtime owns the key: a model-written idempotency_key is neither the key nor the intent (item 3)", async () => {
  const seen = [];
  const charge = idempotent(async (args) => (seen.push(args), { charged: args.customer }), { tool: "charge", store: sqlite() });
  const first = await withScope("run_42", () => charge({ customer: "cus_1", amount: 5, idempotency_key: "k-first" }));
  const second = await withScope("run_42", () => charge({ customer: "cus_1", amount: 5, idempotency_key: "k-second" }));
  assert.deepEqual([first, second], [{ charged: "cus_1" }, { charged: "cus_1" }]);
  assert.equal(seen.length, 1, "the model's new key on its retry did not run it again");
  const derived = deriveKey("run_42", "charge", { customer: "cus_1", amount: 5 });
  assert.equal(seen[0].idempotency_key, derived, "the function is handed the runtime's key");
  // The same model-written key in another run is that run's own intent.
  await withScope("run_43", () => charge({ customer: "cus_2", amount: 5, idempotency_key: "k-first" }));
  assert.equal(seen.length, 2);
  assert.equal(seen[1].customer, "cus_2");
});

test("scopes are read in every declared form and refused otherwise (items 5, 11)", () => {
  const args = { a: 1 };
  const k7 = deriveKey("order_7", "charge", args);
  for (const form of [new Scope("order_7"), { idem_scope: "order_7" }, { format: "idem-scope/v1", id: "order_7" }]) {
    assert.equal(deriveKey(form, "charge", args), k7, JSON.stringify(form));
  }
  assert.notEqual(deriveKey({ idem_scope: "order_8" }, "charge", args), k7);
  for (const bad of [null, undefined, {}, 7, { id: "x" }]) {
    assert.throws(() => deriveKey(bad, "charge", args), TypeError, String(bad));
  }
  assert.throws(() => deriveKey("", "charge", args), DeriveError);
  assert.equal(Scope.from('{"format":"idem-scope/v1","id":"order_7"}').id, "order_7");
  // The form both languages write (Python's Scope.dumps()).
  assert.deepEqual(JSON.parse(JSON.stringify(new Scope("order_7"))), { format: "idem-scope/v1", id: "order_7" });
});

test("an HTTP call's intent is its method, URL and body (item 4)", () => {
  const args = { amount_cents: 100 };
  const keyOf = (method, url, a = args) => deriveKey("run-60", "charge", JSON.parse(requestIntent(url, method, a)));
  const keys = [
    keyOf("POST", "https://api.test/v1/customers/cus_1/charges"),
    keyOf("POST", "https://api.test/v1/customers/cus_2/charges"),
    keyOf("POST", "https://api.test/v1/charges?customer=cus_3"),
    keyOf("POST", "https://api.test/v1/charges?customer=cus_4"),
    keyOf("PUT", "https://api.test/v1/charges?customer=cus_4"),
    keyOf("POST", "https://api.test/orders/o_1/cancel", null),
    keyOf("POST", "https://api.test/orders/o_2/cancel", null),
  ];
  assert.equal(new Set(keys).size, keys.length);
  assert.equal(keyOf("post", "https://api.test/v1/charges?customer=cus_3#frag"), keys[2]);
  // The key Python's IdempotentTransport derives for this request (clients/python/tests/test_keys.py).
  assert.equal(keys[2], "run_60-charge-3k6bmxk6kiujd3eet5jubprgzl7fnclj");
});

test("a lone surrogate in a scope or tool, or the key argument as a key field, is refused", () => {
  assert.throws(() => deriveKey("run\ud800", "t", {}), DeriveError);
  assert.throws(() => deriveKey("run", "t\udc00", {}), DeriveError);
  assert.throws(() => new Scope("run\ud800"), TypeError);
  assert.throws(() => idempotent(async () => 1, { tool: "t\ud800", store: "memory:" }), /lone surrogate/);
  for (const keyFields of [["idempotency_key"], ["/idempotency_key"], ["customer", "idempotency_key.x"]]) {
    assert.throws(() => idempotent(async () => 1, { tool: "t", store: "memory:", keyFields }), /never part of an intent/, keyFields.join());
  }
});

test("a serialised scope given as text is read as the scope, and a scope object with other members is refused", () => {
  const want = deriveKey("order_7", "charge", { a: 1 });
  assert.equal(deriveKey(JSON.stringify(new Scope("order_7")), "charge", { a: 1 }), want);
  assert.equal(deriveKey('{"idem_scope":"order_7"}', "charge", { a: 1 }), want);
  assert.notEqual(deriveKey("{not json", "charge", { a: 1 }), want);
  assert.throws(() => deriveKey({ idem_scope: "order_7", extra: 1 }, "charge", {}), TypeError);
  assert.throws(() => deriveKey({ format: "idem-scope/v2", id: "x" }, "charge", {}), TypeError);
  assert.equal(new DeriveError("x").name, "DeriveError");
});
