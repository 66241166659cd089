// `idem mcp` in front of a lenient upstream, the official TypeScript SDK's server
// (lenient_mcp_server.mjs): messages the proxy cannot read one way are refused, never
// relayed, so no spelling of a tools/call reaches the effect without a key
// ([design §8](../../../docs/design.md#8-mcp)). Each message is first sent to the server
// alone, to show it does run the tool there; through the proxy, none does.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { idemBinary, pkg, tmp } from "./helpers.mjs";

const SERVER = join(pkg, "tests", "lenient_mcp_server.mjs");
const CALL = '"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_1"}}';

/** Spellings of an unkeyed charge_card call that JSON.parse reads and the proxy's reading did not. */
const BYPASSES = {
  "duplicated method": `{"jsonrpc":"2.0","id":11,"method":"tools/list",${CALL}}`,
  "duplicated id": `{"jsonrpc":"2.0","id":12,"id":12,${CALL}}`,
  "duplicated name": '{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"get_balance","name":"charge_card","arguments":{"customer":"cus_1"}}}',
  "number out of range": '{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_1","x":1e400}}}',
  "lone surrogate": '{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_\\ud800"}}}',
  "params.arguments repeated": '{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"a"},"arguments":{"customer":"b"}}}',
};
/** Over streamable HTTP the SDK's server also takes batches, the same key twice in one included. */
const HTTP_BYPASSES = {
  ...BYPASSES,
  batch: `[{"jsonrpc":"2.0","id":10,${CALL}}]`,
  "batch with one key twice": `[{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_1","idempotency_key":"k-twice"}}},{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_1","idempotency_key":"k-twice"}}}]`,
};

const INIT = (id, version) =>
  JSON.stringify({ jsonrpc: "2.0", id, method: "initialize", params: { protocolVersion: version, capabilities: {}, clientInfo: { name: "raw", version: "0" } } });
const INITIALIZED = '{"jsonrpc":"2.0","method":"notifications/initialized"}';

const idOf = (line) => Number(/"id":(\d+)/.exec(line)[1]);
const charges = (file) => (existsSync(file) ? readFileSync(file, "utf8").split("\n").filter(Boolean).length : 0);

/** A child speaking newline-delimited JSON-RPC: send a line, wait for the answer to an id. */
function rawStdio(t, command, args, env) {
  const child = spawn(command, args, { env: { ...process.env, ...env }, stdio: ["pipe", "pipe", "inherit"] });
  t.after(() => child.kill());
  const waiting = new Map();
  const answers = [];
  createInterface({ input: child.stdout }).on("line", (line) => {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch {
      return;
    }
    for (const m of Array.isArray(msg) ? msg : [msg]) {
      answers.push(m);
      const w = waiting.get(JSON.stringify(m.id));
      if (w) w(m);
    }
  });
  return {
    send: (line) => child.stdin.write(`${line}\n`),
    /** The answer to `id`, or null after `ms`. */
    answer: (id, ms = 3000) =>
      new Promise((resolve) => {
        const key = JSON.stringify(id);
        const found = answers.find((m) => JSON.stringify(m.id) === key);
        if (found) return resolve(found);
        const timer = setTimeout(() => resolve(null), ms);
        waiting.set(key, (m) => {
          clearTimeout(timer);
          resolve(m);
        });
      }),
  };
}

async function handshake(peer) {
  peer.send(INIT(0, "2025-06-18"));
  const init = await peer.answer(0, 20000);
  assert.ok(init?.result, `initialize: ${JSON.stringify(init)}`);
  peer.send(INITIALIZED);
}

function stdioPeer(t, throughIdem) {
  const dir = tmp(t);
  const file = join(dir, "charges.txt");
  const env = { CHARGES_FILE: file };
  const peer = throughIdem
    ? rawStdio(t, idemBinary(), ["mcp", "--store", `sqlite:${join(dir, "idem.db")}`, "--", process.execPath, SERVER], env)
    : rawStdio(t, process.execPath, [SERVER], env);
  return { peer, file };
}

test("over stdio the SDK's server runs each spelling alone, and none through idem mcp", async (t) => {
  const bare = stdioPeer(t, false);
  await handshake(bare.peer);
  const ranAlone = {};
  for (const [name, line] of Object.entries(BYPASSES)) {
    const before = charges(bare.file);
    bare.peer.send(line);
    await bare.peer.answer(idOf(line), 3000);
    ranAlone[name] = charges(bare.file) - before;
  }
  // The server is as lenient as the attack needs: these ran with no key at all.
  for (const name of ["duplicated method", "number out of range", "lone surrogate"]) {
    assert.equal(ranAlone[name], 1, `the bare server ran "${name}": ${JSON.stringify(ranAlone)}`);
  }

  const proxied = stdioPeer(t, true);
  await handshake(proxied.peer);
  for (const [name, line] of Object.entries(BYPASSES)) {
    proxied.peer.send(line);
    const answer = await proxied.peer.answer(idOf(line), 10000);
    assert.ok(answer?.error, `"${name}" is answered with a JSON-RPC error: ${JSON.stringify(answer)}`);
    assert.match(answer.error.message, /did not forward/, name);
  }
  // Two messages on one line, joined by a carriage return (a line end to Python's servers).
  proxied.peer.send(`{"jsonrpc":"2.0","id":30,"method":"ping"}\r{"jsonrpc":"2.0","id":31,${CALL}}`);
  proxied.peer.send(`[{"jsonrpc":"2.0","id":32,${CALL}}]`);
  const batch = await proxied.peer.answer(32, 10000);
  assert.match(batch?.error?.message ?? "", /batches/, JSON.stringify(batch));
  assert.equal(charges(proxied.file), 0, "no unkeyed call reached charge_card through idem mcp");

  // A keyed call still runs once and replays.
  const keyed = (id) => `{"jsonrpc":"2.0","id":${id},"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_1","idempotency_key":"turn-1-charge"}}}`;
  proxied.peer.send(keyed(40));
  assert.notEqual((await proxied.peer.answer(40, 20000))?.result?.isError, true);
  proxied.peer.send(keyed(41));
  assert.equal((await proxied.peer.answer(41, 20000))?.result?._meta?.idem?.replayed, true);
  assert.equal(charges(proxied.file), 1);
});

/** Starts `command` and resolves the first stdout line matching `pattern` (its first group). */
function started(t, command, args, env, pattern) {
  const child = spawn(command, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => child.kill());
  return new Promise((resolve, reject) => {
    child.on("exit", (code) => reject(new Error(`${command} exited ${code}`)));
    createInterface({ input: child.stdout }).on("line", (line) => {
      const m = pattern.exec(line);
      if (m) resolve(m[1]);
    });
  });
}

/** A streamable HTTP session at `url`: post a body, get the JSON-RPC messages back. */
async function session(url, headers = {}) {
  const base = { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers };
  const first = await fetch(url, { method: "POST", headers: base, body: INIT(0, "2025-06-18") });
  assert.equal(first.status, 200, await first.clone().text());
  const sid = first.headers.get("mcp-session-id");
  await first.text();
  const h = { ...base, "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18" };
  await (await fetch(url, { method: "POST", headers: h, body: INITIALIZED })).text();
  return {
    post: async (body, extra = {}) => {
      const r = await fetch(url, { method: "POST", headers: { ...h, ...extra }, body });
      const text = await r.text();
      const messages = text
        .split("\n")
        .map((l) => l.replace(/^data: ?/, ""))
        .filter((l) => l.startsWith("{") || l.startsWith("["))
        .flatMap((l) => {
          const v = JSON.parse(l);
          return Array.isArray(v) ? v : [v];
        });
      return { status: r.status, messages };
    },
  };
}

test("over streamable HTTP the SDK's server runs each spelling and batches alone, and none through idem mcp", async (t) => {
  const dir = tmp(t);
  const bareFile = join(dir, "bare.txt");
  const barePort = await started(t, process.execPath, [SERVER, "--http", "0"], { CHARGES_FILE: bareFile }, /^listening (\d+)/);
  const bare = await session(`http://127.0.0.1:${barePort}/mcp`);
  const ranAlone = {};
  for (const [name, body] of Object.entries(HTTP_BYPASSES)) {
    const before = charges(bareFile);
    await bare.post(body);
    ranAlone[name] = charges(bareFile) - before;
  }
  for (const name of ["batch", "duplicated method", "duplicated id", "number out of range", "lone surrogate"]) {
    assert.ok(ranAlone[name] >= 1, `the bare server ran "${name}": ${JSON.stringify(ranAlone)}`);
  }
  assert.equal(ranAlone["batch with one key twice"], 2, JSON.stringify(ranAlone));

  const file = join(dir, "charges.txt");
  rmSync(file, { force: true });
  const port = await started(t, process.execPath, [SERVER, "--http", "0"], { CHARGES_FILE: file }, /^listening (\d+)/);
  const proxy = await started(
    t,
    idemBinary(),
    ["mcp", "--listen", "127.0.0.1:0", "--upstream-url", `http://127.0.0.1:${port}/mcp`, "--store", `sqlite:${join(dir, "idem.db")}`],
    {},
    /listening on (http:\/\/[^\s;]+)/,
  );
  const caller = { authorization: "Bearer agent-1" };
  const s = await session(proxy, caller);
  for (const [name, body] of Object.entries(HTTP_BYPASSES)) {
    const { messages } = await s.post(body);
    assert.ok(messages.length > 0, `"${name}" is answered`);
    for (const m of messages) {
      const refused = m.error?.message?.includes("did not forward") || m.result?._meta?.idem?.problem;
      assert.ok(refused, `"${name}" is refused: ${JSON.stringify(m)}`);
    }
  }
  // A batch in the one protocol version that has batches: each member through the engine.
  const keyed = (id, key) =>
    `{"jsonrpc":"2.0","id":${id},"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_1","idempotency_key":"${key}"}}}`;
  const old = await s.post(`[${keyed(50, "k-batch")},${keyed(51, "k-batch")}]`, { "mcp-protocol-version": "2025-03-26" });
  assert.equal(old.messages.length, 2, JSON.stringify(old));
  assert.equal(charges(file), 1, "one key twice in a batch runs once");
  const again = await s.post(keyed(52, "k-batch"));
  assert.equal(again.messages[0]?.result?._meta?.idem?.replayed, true, JSON.stringify(again));
  const unkeyed = await s.post(`[{"jsonrpc":"2.0","id":53,${CALL}}]`, { "mcp-protocol-version": "2025-03-26" });
  assert.equal(unkeyed.messages[0]?.result?._meta?.idem?.problem, "key-missing", JSON.stringify(unkeyed));
  assert.equal(charges(file), 1, "nothing unkeyed reached charge_card through idem mcp");
});
