// `idem mcp` driven by the official TypeScript SDK (@modelcontextprotocol/sdk, pinned in
// package.json): over stdio (StdioClientTransport) and streamable HTTP
// (StreamableHTTPClientTransport), in front of the example server `idem example-mcp`, with the
// runtime's key in `_meta` as the README shows ([design §8](../../docs/design.md#8-mcp)).
//
// Run: (cd clients/js && npm ci) && node --test clients/js/ (after `cargo build -p idem-cli`).
// The idem binary is $IDEM_BIN, else target/debug/idem under $CARGO_TARGET_DIR or the
// repository. Without the SDK or the binary these tests skip, saying why, unless
// IDEM_REQUIRE_SERVICES=1 (CI), where they fail.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { derive } from "./idem_key.mjs";

const repo = process.env.IDEM_REPO ? resolve(process.env.IDEM_REPO) : resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const required = process.env.IDEM_REQUIRE_SERVICES === "1";

function idemBinary() {
  if (process.env.IDEM_BIN) return process.env.IDEM_BIN;
  let target = process.env.CARGO_TARGET_DIR || join(repo, "target");
  if (!isAbsolute(target)) target = join(repo, target);
  return join(target, "debug", "idem");
}

const IDEM = idemBinary();
let sdk = null;
let why = null;
try {
  sdk = {
    ...(await import("@modelcontextprotocol/sdk/client/index.js")),
    ...(await import("@modelcontextprotocol/sdk/client/stdio.js")),
    ...(await import("@modelcontextprotocol/sdk/client/streamableHttp.js")),
  };
} catch (e) {
  why = `the TypeScript MCP SDK is not installed (cd clients/js && npm ci): ${e.message}`;
}
if (!why && !existsSync(IDEM)) {
  why = `no idem binary at ${IDEM} (cargo build -p idem-cli, or set IDEM_BIN)`;
}
if (why && required) throw new Error(`IDEM_REQUIRE_SERVICES=1 but ${why}`);
if (why) console.log(`skipping the TypeScript MCP client tests: ${why}`);
const skip = why ?? false;

// The README's policy: charge_card takes its key from the runtime only.
const POLICY = '[tools.charge_card]\nkey = "runtime"\n';

function workdir(t) {
  const dir = mkdtempSync(join(tmpdir(), "idem-mcp-js-"));
  writeFileSync(join(dir, "idem-mcp.toml"), POLICY);
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return {
    store: `sqlite:${join(dir, "idem.db")}`,
    db: join(dir, "charges.db"),
    policy: join(dir, "idem-mcp.toml"),
  };
}

function client() {
  return new sdk.Client({ name: "idem-js-test", version: "0" });
}

function idem(result) {
  return result._meta?.idem ?? {};
}

async function charges(c, customer) {
  const r = await c.callTool({ name: "get_balance", arguments: { customer } });
  assert.notEqual(r.isError, true, JSON.stringify(r));
  assert.equal(idem(r).replayed, undefined, "a read tool passes straight through");
  return r.structuredContent.charges;
}

/** What the README promises for a runtime that sets `_meta.idempotency_key`. */
async function runtimeKeyChargesOnce(c) {
  const { tools } = await c.listTools();
  const schema = (name) => tools.find((t) => t.name === name).inputSchema;
  // key = "runtime": the model is not asked for a key; send_email (default "model") is.
  assert.equal(schema("charge_card").properties.idempotency_key, undefined);
  assert.ok(!(schema("charge_card").required ?? []).includes("idempotency_key"));
  assert.equal(schema("send_email").properties.idempotency_key.type, "string");

  // The runtime's key, derived at the point of intent as README shows: (run, tool, args).
  const runId = "turn-1";
  const args = { customer: "cus_js", amount_cents: 4900 };
  const meta = { idempotency_key: derive(runId, "charge_card", args) };
  const first = await c.callTool({ name: "charge_card", arguments: args, _meta: meta });
  assert.notEqual(first.isError, true, JSON.stringify(first));
  assert.deepEqual(idem(first), {});
  const again = await c.callTool({ name: "charge_card", arguments: args, _meta: meta });
  assert.deepEqual(idem(again), { replayed: true, key: meta.idempotency_key });
  assert.deepEqual(again.structuredContent, first.structuredContent);
  assert.equal(await charges(c, "cus_js"), 1);

  // The model retries and invents a key of its own; the runtime's key is unchanged: a replay.
  const retry = await c.callTool({
    name: "charge_card",
    arguments: { ...args, idempotency_key: "made-up-by-the-model" },
    _meta: meta,
  });
  assert.deepEqual(idem(retry), { replayed: true, key: meta.idempotency_key });
  assert.deepEqual(retry.structuredContent, first.structuredContent);
  assert.equal(await charges(c, "cus_js"), 1);

  // No runtime key: refused as a tool error, nothing charged.
  const refused = await c.callTool({ name: "charge_card", arguments: args });
  assert.equal(refused.isError, true);
  assert.equal(idem(refused).problem, "key-missing");
  // A new intent (a new runtime key) charges again.
  const next = await c.callTool({
    name: "charge_card",
    arguments: args,
    _meta: { idempotency_key: "turn-2-charge_card" },
  });
  assert.deepEqual(idem(next), {});
  assert.equal(await charges(c, "cus_js"), 2);
}

test("stdio: the runtime's _meta key charges once, whatever key the model invents", { skip, timeout: 60_000 }, async (t) => {
  const d = workdir(t);
  const transport = new sdk.StdioClientTransport({
    command: IDEM,
    args: ["mcp", "--store", d.store, "--policy", d.policy, "--", IDEM, "example-mcp", "--db", d.db],
    stderr: "inherit",
  });
  const c = client();
  await c.connect(transport);
  t.after(() => c.close());
  await runtimeKeyChargesOnce(c);
});

/** Starts `idem ARGS`, killed when the test ends, and returns the URL of its first line. */
async function spawnHttp(t, args) {
  const child = spawn(IDEM, args, { stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => child.kill("SIGKILL"));
  const lines = createInterface({ input: child.stdout });
  const exited = new Promise((_, reject) =>
    child.once("exit", (code) => reject(new Error(`idem ${args[0]} exited (${code})`))),
  );
  const [line] = await Promise.race([(async () => { for await (const l of lines) return [l]; return [""]; })(), exited]);
  const url = line.split(/\s+/).find((w) => w.startsWith("http://"))?.replace(/;$/, "");
  assert.ok(url, `no URL in ${JSON.stringify(line)}`);
  return url;
}

test("streamable HTTP: the runtime's _meta key charges once, per caller", { skip, timeout: 60_000 }, async (t) => {
  const d = workdir(t);
  const upstream = await spawnHttp(t, ["example-mcp", "--listen", "127.0.0.1:0", "--db", d.db]);
  const proxy = await spawnHttp(t, [
    "mcp", "--listen", "127.0.0.1:0", "--upstream-url", upstream, "--store", d.store, "--policy", d.policy,
  ]);
  const connect = async (token) => {
    const c = client();
    await c.connect(new sdk.StreamableHTTPClientTransport(new URL(proxy), {
      requestInit: { headers: { authorization: `Bearer ${token}` } },
    }));
    t.after(() => c.close());
    return c;
  };
  const alice = await connect("alice");
  await runtimeKeyChargesOnce(alice);
  // A new session of the same caller still replays; another caller's same key is theirs.
  const aliceAgain = await connect("alice");
  const args = { customer: "cus_js", amount_cents: 4900 };
  const meta = { idempotency_key: derive("turn-1", "charge_card", args) };
  const replay = await aliceAgain.callTool({ name: "charge_card", arguments: args, _meta: meta });
  assert.equal(idem(replay).replayed, true);
  const bob = await connect("bob");
  const theirs = await bob.callTool({ name: "charge_card", arguments: args, _meta: meta });
  assert.deepEqual(idem(theirs), {});
  assert.equal(await charges(bob, "cus_js"), 3);
});
