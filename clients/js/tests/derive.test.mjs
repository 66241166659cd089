// The native derivation (deriveKey, Rust idem-keys) reproduces every vector of
// docs/key-vectors.json and agrees with the pure-JS one (idem_key.mjs) on random arguments.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { DeriveError, deriveKey, deriveKeyFromJson } from "../index.js";
import { derive, parseArgs } from "../idem_key.mjs";
import { repo } from "./helpers.mjs";

const doc = JSON.parse(readFileSync(join(repo, "docs", "key-vectors.json"), "utf8"));

test("every vector, from its JSON text", () => {
  assert.ok(doc.vectors.length >= 30);
  for (const v of doc.vectors) {
    const secret = v.secret_hex === null ? undefined : Buffer.from(v.secret_hex, "hex");
    if ("error" in v) {
      assert.throws(() => deriveKeyFromJson(v.scope, v.tool, v.args_json, { ordinal: v.ordinal, secret }),
        (e) => e instanceof DeriveError && e.message.includes(v.error), v.name);
    } else {
      assert.equal(deriveKeyFromJson(v.scope, v.tool, v.args_json, { ordinal: v.ordinal, secret }), v.key, v.name);
      // And from the parsed value, as a tool's caller passes it.
      assert.equal(deriveKey(v.scope, v.tool, parseArgs(v.args_json), { ordinal: v.ordinal, secret }), v.key, v.name);
    }
  }
});

// A small deterministic generator (no seed from the clock: a failure reproduces).
function rng(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

function randomValue(r, depth) {
  const pick = Math.floor(r() * (depth > 2 ? 5 : 7));
  const strings = ["", "a", "é", "日本", "😀", "\u0000\n\"\\", "idempotency_key", "x".repeat(40)];
  switch (pick) {
    case 0: return null;
    case 1: return r() < 0.5;
    case 2: return Math.floor((r() - 0.5) * 2 ** 53);
    case 3: return [0.1, -0, 1e-7, 123.456, 5e-324, 1e20, (r() - 0.5) * 1e6][Math.floor(r() * 7)];
    case 4: return strings[Math.floor(r() * strings.length)] + String(Math.floor(r() * 100));
    case 5: return Array.from({ length: Math.floor(r() * 4) }, () => randomValue(r, depth + 1));
    default: {
      const o = {};
      for (let i = Math.floor(r() * 5); i > 0; i--) o[strings[Math.floor(r() * strings.length)] + i] = randomValue(r, depth + 1);
      return o;
    }
  }
}

test("native and pure-JS derivations agree on 2000 random inputs", () => {
  const r = rng(15);
  let agreedKeys = 0;
  for (let i = 0; i < 2000; i++) {
    const args = randomValue(r, 0);
    const scope = `run-${i}`;
    const secret = i % 3 === 0 ? Buffer.from(`s${i}`) : undefined;
    const ordinal = i % 5;
    const outcome = (f) => {
      try {
        return f();
      } catch (e) {
        assert.ok(e instanceof DeriveError, String(e));
        return "refused";
      }
    };
    const native = outcome(() => deriveKey(scope, "tool_x", args, { ordinal, secret }));
    const js = outcome(() => derive(scope, "tool_x", args, ordinal, secret));
    assert.equal(native, js, JSON.stringify(args));
    if (native !== "refused") agreedKeys++;
  }
  assert.ok(agreedKeys > 1500, `most inputs make keys (${agreedKeys})`);
});

test("keyFields derive from the named arguments only", () => {
  const a = deriveKey("run", "t", { customer: "c", at: 1 }, { keyFields: ["customer"] });
  const b = deriveKey("run", "t", { customer: "c", at: 2 }, { keyFields: ["customer"] });
  assert.equal(a, b);
  assert.equal(a, derive("run", "t", { customer: "c" }));
  assert.throws(() => deriveKey("run", "t", { customer: "c" }, { keyFields: ["custmer"] }), /not in the arguments \(they have: customer\)/);
  assert.throws(() => deriveKey("run", "t", 10n), DeriveError);
});
