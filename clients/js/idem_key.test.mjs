// Reproduces every vector of docs/key-vectors.json byte for byte. Run: node --test clients/js/
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

import { DeriveError, canonical, canonicalBytes, derive, parseArgs } from "./idem_key.mjs";

const here = dirname(fileURLToPath(import.meta.url));
// The repository: where this file sits in a checkout, or $IDEM_REPO (run beside an installed package).
const repo = process.env.IDEM_REPO ?? join(here, "..", "..");
const doc = JSON.parse(readFileSync(join(repo, "docs", "key-vectors.json"), "utf8"));

test("there are at least 30 vectors", () => {
  assert.ok(doc.vectors.length >= 30);
});

for (const v of doc.vectors) {
  test(`vector: ${v.name}`, () => {
    const secret = v.secret_hex === null ? undefined : Buffer.from(v.secret_hex, "hex");
    let key, bytes;
    try {
      const args = parseArgs(v.args_json);
      bytes = canonicalBytes(v.scope, v.tool, args, v.ordinal);
      key = derive(v.scope, v.tool, args, v.ordinal, secret);
    } catch (e) {
      assert.ok(e instanceof DeriveError, `unexpected ${e}`);
      assert.ok("error" in v, `unexpected error: ${e.message}`);
      assert.ok(e.message.includes(v.error), e.message);
      return;
    }
    assert.ok(!("error" in v), `expected an error, got ${key}`);
    assert.equal(bytes.toString("utf8"), v.canonical);
    assert.equal(key, v.key);
  });
}

test("numbers are written as ECMAScript writes them", () => {
  assert.equal(canonical([1.0, -0, 0.1, 1e-7, 5e-324, 123.456]), "[1,0,0.1,1e-7,5e-324,123.456]");
  assert.throws(() => canonical(1e21), DeriveError);
  assert.throws(() => canonical(10n), DeriveError);
  assert.throws(() => parseArgs('{"id":9007199254740993}'), DeriveError);
  assert.equal(canonical(parseArgs('{"s":"1e400 in a string is fine"}')), '{"s":"1e400 in a string is fine"}');
});

test("derive is positional: an options object as the ordinal says so", () => {
  assert.throws(
    () => derive("run", "t", { a: 1 }, { keyFields: ["a"] }),
    (e) => e instanceof DeriveError && /positional/.test(e.message) && /keyFields/.test(e.message),
  );
  assert.equal(derive("run", "t", { a: 1 }, 0), derive("run", "t", { a: 1 }));
});
