#!/usr/bin/env node
// The `idem` command of the npm package (`npx idem-runtime ...`): the Rust binary (gateway, MCP
// proxy, inspect, resolve, ...) that the platform package carries, run as a child with the
// standard streams inherited (EOF on stdin reaches it as if it had been run directly) and every
// signal this process gets passed on to it; its exit status, or the signal that ended it, is
// this command's. A stdio MCP proxy under an MCP client's `"command": "npx"` line needs exactly
// that: the client's SIGTERM and its closing of stdin end the proxy, not just the launcher.
//
// npx does not hand a signal to this process: it runs the bin through `sh -c`, and the shell
// passes none on. So the launcher also watches its parent: when npx and its shell are gone
// (this process reparented), the binary gets SIGTERM, as it would have from them.
import { spawn } from "node:child_process";
import { accessSync, chmodSync, closeSync, constants, openSync, readSync, statSync } from "node:fs";
import { constants as os } from "node:os";
import { resolve } from "node:path";

import { binaryPath, expectedBinarySize } from "../platform.js";

/** Signals passed on (SIGKILL and SIGSTOP cannot be caught; SIGUSR1 is Node's debugger's). */
const FORWARDED = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR2", "SIGWINCH"];

function fail(message) {
  process.stderr.write(`${message}\n`);
  process.exit(127);
}

// Who launched us, read first: npx may be gone before the binary has started.
const parent = process.ppid;

// Handlers first: a signal that arrives while the binary is being checked or started is held
// for it, never lost with the launcher (which would leave the binary running).
let child = null;
const pending = [];
for (const signal of FORWARDED) {
  process.on(signal, () => {
    if (!child) pending.push(signal);
    else if (child.exitCode === null && child.signalCode === null) child.kill(signal);
  });
}

let path;
try {
  // Resolved here, so the file checked is the file run (spawn would search PATH for a bare
  // name, where npx puts this launcher itself).
  path = resolve(binaryPath());
} catch (e) {
  fail(e.message);
}
const yourOwn = process.env.IDEM_BINARY
  ? "check IDEM_BINARY, which names it"
  : "reinstall idem-runtime (npm install idem-runtime), or set IDEM_BINARY to a build of your own";
let stat;
try {
  stat = statSync(path);
} catch {
  fail(`idem-runtime: the idem binary is not at ${path}; ${yourOwn}`);
}
if (!stat.isFile()) fail(`idem-runtime: the idem binary is not at ${path} (not a file); ${yourOwn}`);

// What an executable of this platform starts with (or `#!`, a script the kernel runs). Checked
// before spawning: a file the kernel cannot run (ENOEXEC) is otherwise handed to /bin/sh by
// execvp, which prints nonsense.
const MAGIC = { linux: [0x7f, 0x45, 0x4c, 0x46], darwin: null, win32: [0x4d, 0x5a] }[process.platform];
const damaged = (why) =>
  fail(
    `idem-runtime: ${path} cannot be run (${why}): the file is damaged, or not built for this machine ` +
      `(${process.platform} ${process.arch}); ${yourOwn}`,
  );
const expected = process.env.IDEM_BINARY ? null : expectedBinarySize();
if (expected !== null && stat.size !== expected) damaged(`${stat.size} bytes where the package has ${expected}`);
let head = null;
try {
  head = Buffer.alloc(4);
  const fd = openSync(path, "r");
  head = head.subarray(0, readSync(fd, head, 0, head.length, 0));
  closeSync(fd);
} catch {
  head = null; // Executable but not readable (mode 0711): the kernel is the judge.
}
if (MAGIC && head) {
  const script = process.platform !== "win32" && head[0] === 0x23 && head[1] === 0x21;
  if (!script && (head.length < MAGIC.length || MAGIC.some((b, i) => head[i] !== b))) damaged("not an executable for this platform");
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

child = spawn(path, process.argv.slice(2), { stdio: "inherit" });
for (const signal of pending) child.kill(signal);

// Reparented: whoever launched us (npx, its shell) is gone without a word to us.
const watch = setInterval(() => {
  if (process.ppid !== parent && child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
}, 500);
watch.unref();

child.on("error", (e) => damaged(e.code ?? e.message));
child.on("exit", (code, signal) => {
  clearInterval(watch);
  if (signal) {
    // Ended by a signal: end this process by the same one, so its parent sees what it would
    // have seen of the binary itself; but not by one Node gives a meaning of its own (SIGUSR1
    // starts its debugger) or ignores (SIGPIPE): those exit with the shell's 128 + n.
    const n = os.signals[signal] ?? 0;
    if (signal === "SIGUSR1" || signal === "SIGPIPE") process.exit(128 + n);
    for (const s of FORWARDED) process.removeAllListeners(s);
    process.kill(process.pid, signal);
    // A signal whose default is not to end the process: the shell's convention.
    setTimeout(() => process.exit(128 + n), 500);
    return;
  }
  process.exit(code ?? 1);
});
