#!/usr/bin/env node
// The `idem` command of the npm package (`npx idem-runtime ...`): the Rust binary (gateway, MCP
// proxy, inspect, resolve, ...) that the platform package carries, run as a child with the
// standard streams inherited (EOF on stdin reaches it as if it had been run directly) and every
// signal this process gets passed on to it; its exit status, or the signal that ended it, is
// this command's. A stdio MCP proxy under an MCP client's `"command": "npx"` line needs exactly
// that: the client's SIGTERM and its closing of stdin end the proxy, not just the launcher.
import { spawn } from "node:child_process";
import { accessSync, chmodSync, closeSync, constants, openSync, readSync, statSync } from "node:fs";
import { constants as os } from "node:os";

import { binaryPath, expectedBinarySize } from "../platform.js";

/** Signals passed on (SIGKILL and SIGSTOP cannot be caught; SIGUSR1 is Node's debugger's). */
const FORWARDED = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR2", "SIGWINCH"];

function fail(message) {
  process.stderr.write(`${message}\n`);
  process.exit(127);
}

let path;
try {
  path = binaryPath();
} catch (e) {
  fail(e.message);
}
try {
  if (!statSync(path).isFile()) fail(`idem-runtime: the idem binary is not at ${path} (not a file); reinstall idem-runtime`);
} catch {
  fail(`idem-runtime: the idem binary is not at ${path}; reinstall idem-runtime (npm install idem-runtime), or set IDEM_BINARY to a build of your own`);
}
// What an executable of this platform starts with (or `#!`, a script the kernel runs). Checked
// before spawning: a file the kernel cannot run (ENOEXEC) is otherwise handed to /bin/sh by
// execvp, which prints nonsense.
const MAGIC = { linux: [0x7f, 0x45, 0x4c, 0x46], darwin: null, win32: [0x4d, 0x5a] }[process.platform];
const damaged = (why) =>
  fail(`idem-runtime: ${path} cannot be run (${why}): the file is damaged, or not built for this machine (${process.platform} ${process.arch}); reinstall idem-runtime`);
const size = statSync(path).size;
const expected = process.env.IDEM_BINARY ? null : expectedBinarySize();
if (expected !== null && size !== expected) damaged(`${size} bytes where the package has ${expected}`);
if (MAGIC) {
  const head = Buffer.alloc(MAGIC.length);
  const fd = openSync(path, "r");
  const got = readSync(fd, head, 0, head.length, 0);
  closeSync(fd);
  const script = process.platform !== "win32" && head[0] === 0x23 && head[1] === 0x21;
  if (!script && (got < MAGIC.length || MAGIC.some((b, i) => head[i] !== b))) damaged("not an executable for this platform");
}
try {
  accessSync(path, constants.X_OK);
} catch {
  // A package manager that dropped the mode bit when it unpacked the tarball.
  try {
    chmodSync(path, 0o755);
  } catch {
    fail(`idem-runtime: ${path} is not executable, and cannot be made so`);
  }
}

const child = spawn(path, process.argv.slice(2), { stdio: "inherit" });
for (const signal of FORWARDED) {
  process.on(signal, () => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
  });
}
child.on("error", (e) => damaged(e.code ?? e.message));
child.on("exit", (code, signal) => {
  if (signal) {
    // Ended by a signal: end this process by the same one, so its parent sees what it would
    // have seen of the binary itself.
    for (const s of FORWARDED) process.removeAllListeners(s);
    process.kill(process.pid, signal);
    // A signal whose default is not to end the process: the shell's convention.
    setTimeout(() => process.exit(128 + (os.signals[signal] ?? 0)), 500);
    return;
  }
  process.exit(code ?? 1);
});
