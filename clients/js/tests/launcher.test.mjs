// The `idem` bin of the npm package (bin/idem.mjs): the binary it runs gets the standard
// streams and every forwarded signal as if it had been run directly, its exit (code or
// signal) is the launcher's, and a missing or damaged binary, or a machine with no prebuilt
// package, is one message naming the path or the platforms. IDEM_BINARY stands in for the
// platform package's binary: a shell script that reports what it got.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { chmodSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { tmp } from "./helpers.mjs";

const LAUNCHER = fileURLToPath(new URL("../bin/idem.mjs", import.meta.url));

function script(dir, body) {
  const path = join(dir, "fake-idem");
  writeFileSync(path, `#!/bin/sh\n${body}\n`);
  chmodSync(path, 0o755);
  return path;
}

function launch(env, args = [], stdio = "pipe") {
  return spawn(process.execPath, [LAUNCHER, ...args], { env: { ...process.env, ...env }, stdio });
}

const exited = (child) => new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));

async function until(check) {
  for (let i = 0; i < 200 && !check(); i++) await new Promise((r) => setTimeout(r, 25));
  assert.ok(check(), "in time");
}

test("arguments, stdin, stdout and the exit code pass through", (t) => {
  const dir = tmp(t);
  const bin = script(dir, 'echo "args:$*"; cat; exit 7');
  const r = spawnSync(process.execPath, [LAUNCHER, "mcp", "--store", "memory:"], {
    env: { ...process.env, IDEM_BINARY: bin },
    input: "from stdin\n",
    encoding: "utf8",
  });
  assert.equal(r.status, 7);
  assert.equal(r.stdout, "args:mcp --store memory:\nfrom stdin\n");
});

test("SIGTERM reaches the binary, which exits on its own terms", async (t) => {
  const dir = tmp(t);
  const mark = join(dir, "got");
  const bin = script(dir, `trap 'echo TERM > ${mark}; exit 0' TERM\necho ready\nwhile :; do sleep 0.05; done`);
  const child = launch({ IDEM_BINARY: bin });
  const done = exited(child);
  await new Promise((resolve) => child.stdout.once("data", resolve));
  child.kill("SIGTERM");
  assert.deepEqual(await done, { code: 0, signal: null });
  assert.equal(readFileSync(mark, "utf8").trim(), "TERM");
});

test("EOF on stdin reaches the binary", async (t) => {
  const dir = tmp(t);
  const bin = script(dir, "cat > /dev/null; exit 3");
  const child = launch({ IDEM_BINARY: bin });
  const done = exited(child);
  child.stdin.end();
  assert.deepEqual(await done, { code: 3, signal: null });
});

test("a binary ended by a signal ends the launcher by the same signal", async (t) => {
  const dir = tmp(t);
  const bin = script(dir, "kill -KILL $$");
  assert.deepEqual(await exited(launch({ IDEM_BINARY: bin })), { code: null, signal: "SIGKILL" });
});

test("a missing binary is named with the path looked in", (t) => {
  const missing = join(tmp(t), "no-such-idem");
  const r = spawnSync(process.execPath, [LAUNCHER, "--version"], { env: { ...process.env, IDEM_BINARY: missing }, encoding: "utf8" });
  assert.equal(r.status, 127);
  assert.match(r.stderr, new RegExp(`idem binary is not at ${missing}`));
});

test("a damaged binary is named, with what to do", async (t) => {
  const dir = tmp(t);
  const bad = join(dir, "idem");
  writeFileSync(bad, "<html>a proxy's error page, saved as the binary</html>\n");
  chmodSync(bad, 0o755);
  const r = spawnSync(process.execPath, [LAUNCHER, "--version"], { env: { ...process.env, IDEM_BINARY: bad }, encoding: "utf8" });
  assert.equal(r.status, 127);
  assert.match(r.stderr, new RegExp(`${bad} cannot be run \\(not an executable for this platform\\): the file is damaged, or not built for this machine`));
});

test("a machine with no prebuilt package is told which exist and how to build", (t) => {
  const env = { ...process.env, IDEM_RUNTIME_PLATFORM: "freebsd-riscv64" };
  delete env.IDEM_BINARY;
  const r = spawnSync(process.execPath, [LAUNCHER, "--version"], { env, encoding: "utf8" });
  assert.equal(r.status, 127);
  assert.match(r.stderr, /no prebuilt package exists for freebsd-riscv64; prebuilt: linux-x64-gnu/);
  assert.match(r.stderr, /cargo build --release -p idem-cli/);
  assert.ok(existsSync(LAUNCHER));
});

test("a launcher whose parent is gone (npx and its shell, which pass no signal on) stops the binary", async (t) => {
  const dir = tmp(t);
  const mark = join(dir, "got");
  const bin = script(dir, `trap 'echo TERM > ${mark}; exit 0' TERM\necho ready\nwhile :; do sleep 0.05; done`);
  // sh -c stands for npx's shell: killing it leaves the launcher reparented, told nothing.
  const shell = spawn("/bin/sh", ["-c", `"${process.execPath}" "${LAUNCHER}"; :`], {
    env: { ...process.env, IDEM_BINARY: bin },
    stdio: ["pipe", "pipe", "inherit"],
  });
  await new Promise((resolve) => shell.stdout.once("data", resolve));
  shell.kill("SIGKILL");
  await until(() => existsSync(mark));
  assert.equal(readFileSync(mark, "utf8").trim(), "TERM");
});

test("a binary ended by SIGUSR1 ends the launcher with 128 + n, not in Node's debugger", async (t) => {
  const dir = tmp(t);
  const bin = script(dir, "kill -USR1 $$");
  assert.deepEqual(await exited(launch({ IDEM_BINARY: bin })), { code: 138, signal: null });
});
