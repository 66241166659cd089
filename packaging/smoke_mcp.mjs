// An MCP host's view of the installed npm package: the official SDK's stdio client launches
// `npx idem-runtime mcp ...` as a client config line would ("command": "npx"), with the
// upstream given by --upstream-cmd, and calls an effect tool twice with one key. Then the
// launcher chain's shutdown: a client that closes stdin, and a host that sends SIGTERM, must
// each end the proxy (the binary under npx and bin/idem.mjs), not just the launcher. npx passes
// no signal on (it runs the bin through sh -c): the launcher sees its parent go.
//
//     node packaging/smoke_mcp.mjs PROJECT_DIR IDEM_FOR_THE_UPSTREAM
//
// PROJECT_DIR has idem-runtime and @modelcontextprotocol/sdk installed.
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { closeSync, mkdtempSync, openSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [project, upstreamIdem] = process.argv.slice(2);
const require = createRequire(join(project, "package.json"));
const { Client } = await import(require.resolve("@modelcontextprotocol/sdk/client/index.js"));
const { StdioClientTransport } = await import(require.resolve("@modelcontextprotocol/sdk/client/stdio.js"));

const dir = mkdtempSync(join(tmpdir(), "idem-npx-mcp-"));
const proxyArgs = ["--no-install", "idem-runtime", "mcp", "--store", `sqlite:${join(dir, "idem.db")}`,
  "--upstream-cmd", `${upstreamIdem} example-mcp --db ${join(dir, "charges.db")}`];

/** The pids of every process whose command line mentions this run's directory. */
function running() {
  const out = execFileSync("ps", ["-eo", "pid=,args="], { encoding: "utf8" });
  return out.split("\n").filter((l) => l.includes(dir) && !l.includes("smoke_mcp")).map((l) => l.trim());
}

async function waitGone(what) {
  for (let i = 0; i < 100 && running().length > 0; i++) await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(running(), [], `${what}: processes left running`);
}

try {
  const transport = new StdioClientTransport({ command: "npx", args: proxyArgs, cwd: project, stderr: "inherit" });
  const client = new Client({ name: "smoke", version: "1.0.0" });
  await client.connect(transport);
  const { tools } = await client.listTools();
  assert.ok(tools.find((t) => t.name === "charge_card")?.inputSchema.required.includes("idempotency_key"));
  const call = (key) =>
    client.callTool({ name: "charge_card", arguments: { customer: "cus_1", amount_cents: 4900, idempotency_key: key } });
  const first = await call("intent-1");
  const again = await call("intent-1");
  const other = await call("intent-2");
  assert.notEqual(first.isError, true, JSON.stringify(first));
  assert.deepEqual(again.content, first.content);
  assert.equal(again._meta?.idem?.replayed, true, JSON.stringify(again._meta));
  assert.notDeepEqual(other.content, first.content);
  // The client closes stdin (and, after a grace, signals): the whole chain ends.
  await client.close();
  await waitGone("after the client closed");

  // A host's SIGTERM to the command it launched (npx) ends the proxy under it, with its stdin
  // still open (a FIFO this process holds both ends of), so no EOF can be what ends it.
  const fifo = join(dir, "stdin.fifo");
  execFileSync("mkfifo", [fifo]);
  const held = openSync(fifo, "r+");
  const child = spawn("npx", proxyArgs, { cwd: project, stdio: [held, "pipe", "inherit"] });
  // The binary itself running, not just npx (whose own command line says `mcp` too).
  const proxyRuns = () => running().some((l) => /\/bin\/idem mcp /.test(l));
  for (let i = 0; i < 100 && !proxyRuns(); i++) await new Promise((r) => setTimeout(r, 100));
  assert.ok(proxyRuns(), "the proxy started");
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  child.kill("SIGTERM");
  const status = await exited;
  await waitGone("after SIGTERM");
  closeSync(held);
  console.log(`npx idem-runtime mcp: one charge for two calls with one key, replay marked; EOF and SIGTERM (${JSON.stringify(status)}) end the proxy`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
