// Loads the native module built by scripts/build-native.mjs (npm's install script).
import { createRequire } from "node:module";
import { isMainThread } from "node:worker_threads";

const require = createRequire(import.meta.url);

function load() {
  try {
    return require("./idem_node.node");
  } catch (e) {
    throw new Error(
      `idem-runtime: the native module idem_node.node could not be loaded (${e.message}). ` +
        "It is built when the package is installed; run `npm rebuild idem-runtime` " +
        "(or `node scripts/build-native.mjs` in clients/js), which needs a Rust toolchain.",
      { cause: e },
    );
  }
}

export const native = load();

// At exit the stores are closed: a SQLite store's file is then complete and alone, with no
// -wal or -shm beside it (the native host is never dropped, so nothing else would close it).
// Only the main thread's exit is the process's: a worker thread's `exit` event fires when that
// worker ends, and the stores are the whole process's.
if (isMainThread) {
  process.once("exit", () => native.shutdown());
}
