// Loads the native module: a build in this directory (scripts/build-native.mjs, the install
// script of a checkout: `npm install` in clients/js, or `npm install ./clients/js`), else the
// platform package's prebuilt one (platform.js).
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { isMainThread } from "node:worker_threads";

import { platformDir, unsupported } from "./platform.js";

const require = createRequire(import.meta.url);

function load() {
  const local = new URL("./idem_node.node", import.meta.url);
  const dir = existsSync(local) ? null : platformDir();
  const path = dir ? join(dir, "idem_node.node") : fileURLToPath(local);
  if (!dir && !existsSync(local)) throw unsupported("the native module (idem_node.node)");
  try {
    return require(path);
  } catch (e) {
    throw new Error(
      `idem-runtime: the native module at ${path} could not be loaded (${e.message}): the file is damaged, ` +
        "or not built for this machine; reinstall idem-runtime (or, in a checkout, `npm rebuild` in clients/js).",
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
