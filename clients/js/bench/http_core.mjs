// What the HTTP core costs through the binding, without a framework or a socket: the three
// native calls a keyed request makes in the Express, Fastify and Hono middleware (`admit`, then
// `beginNow` and `finishNow` on a memory: store), in a loop, CPU µs per request. Beside the
// middleware's figures in docs/benchmarks.md ("Issue 29"), it separates the core's cost from
// the framework's and Node's around it.
// Run: node clients/js/bench/http_core.mjs [requests]   (after npm install)
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { begin, finish, fromNodeHeaders, joinRaw, openFront } from "../http.js";

const n = Number(process.argv[2] ?? 100_000);
const dir = mkdtempSync(join(tmpdir(), "idem-core-bench-"));
const config = join(dir, "idem.toml");
writeFileSync(config, 'anonymous = "allow"\n[[routes]]\nmethod = "POST"\npath = "/v1/charges"\nrequire_key = true\n');
const front = await openFront({ config, store: "memory:" });

const body = Buffer.from('{"customer":"cus_8g2k","amount_cents":4900}');
const raw = ["Host", "127.0.0.1:3000", "Content-Type", "application/json", "Content-Length", String(body.length), "Idempotency-Key", ""];
const responseHeaders = { "content-type": "application/json; charset=utf-8", "content-length": "90" };
const responseBody = Buffer.from('{"id":"ch_123456789012","object":"charge","customer":"cus_8g2k","amount":4900}');
const run = `${process.pid}-${Date.now()}`;

function one(i, mode) {
  raw[7] = mode === "replay" ? `${run}-replay` : `${run}-${mode}-${i}`;
  const admission = front.admit("POST", "/v1/charges", joinRaw(raw));
  if (mode === "admit") return;
  const begun = begin(admission, body);
  if (begun.reply) return;
  finish(begun, 201, fromNodeHeaders(responseHeaders), responseBody);
}

console.log(`node ${process.version}, ${n} requests per row, memory: store; CPU µs per request`);
for (const mode of ["admit", "new", "replay"]) {
  for (let i = 0; i < 20_000; i++) one(-i - 1, mode); // warm (and store the replayed key)
  const before = process.cpuUsage();
  for (let i = 0; i < n; i++) one(i, mode);
  const used = process.cpuUsage(before);
  const label = { admit: "admit only", new: "new key (admit, beginNow, finishNow)", replay: "replay (admit, beginNow)" }[mode];
  console.log(`${label.padEnd(40)} ${((used.user + used.system) / n).toFixed(2)}`);
}
rmSync(dir, { recursive: true, force: true });
